"""The TUI's turns: each runs through agentctx.conversation in a worker thread, reporting
to the chat screen with messages; the store is only touched on the main thread. A turn's
question is stored before it runs and its answer as it streams (agentctx.tui.turn_writes),
so a killed TUI leaves the turn marked interrupted; a store that refuses the question
(locked) gets the whole turn when it ends, or before the next question."""

from __future__ import annotations

import threading
from functools import partial

from agentctx.context_choice import ContextChoice
from agentctx.conversation import Conversation, Turn
from agentctx.tui.errors import user_errors
from agentctx.tui.outputs import Report, Silent, TurnOutput
from agentctx.tui.screens import AnswerUpdate, LogMessage, TurnFinished
from agentctx.tui.turn_writes import MainThreadRecord, fail_record, start_record


def off_main_thread(fn) -> None:
    """fn() on a thread of its own, waited for; its exception is raised here. On the CPU,
    torch work on the main thread starts an OpenMP pool there that lasts as long as the app,
    and the turns' worker threads then decode at about half speed (their pools sleep between
    parallel regions beside it: 37 -> 21 tok/s with the default model); a pool started on a
    thread that ends goes with it."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 (raised again on the caller's thread)
            failed.append(e)

    thread = threading.Thread(target=run, name="agentctx-off-main")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


class TurnRunner:
    """Runs the app's turns. `conversation` holds the engine session (pinned KV) of the
    current stored session between turns; `unsaved` is a turn the store refused (locked),
    kept to store before the next question."""

    def __init__(self, app) -> None:
        self.app = app
        self.conversation = Conversation()
        self.unsaved: tuple | None = None  # (turn, its TurnRecord or None)
        self.choice = ContextChoice()  # /add and /drop, for the next turn
        self._stream = None  # the step streaming now
        self._cancel = False

    def ask(self, question: str) -> None:
        app = self.app
        if app.busy:
            app.chat.add_line("an answer is running: wait, or press Esc to cancel", "error")
            return
        try:
            question.encode("utf-8")
        except UnicodeEncodeError:
            app.chat.add_line("the question has text that is not valid UTF-8", "error")
            return
        if not self.store_unsaved():
            app.chat.add_line("the last turn is not stored yet: ask again when the session "
                              "store is free", "error")  # fmt: skip
            return
        history = None
        if app.session is not None:
            try:
                history = app.sessions.history(app.session.id)  # store: main thread
            except user_errors() as e:  # deleted by another agentctx, say
                app._session_gone(e)
                return
        app.chat.add_user(question)
        app.busy, app.streaming, self._cancel = True, False, False
        work = partial(self._run, question, history, app.session)
        app.run_worker(work, thread=True, exclusive=True, group="turn")

    def _run(self, question: str, history: list[dict] | None, session) -> None:
        """The turn (worker thread): pack -> open -> run here, the store written on the main
        thread."""
        app, post = self.app, self.app.chat.post_message
        record = None
        try:
            backend = self._backend(post)
            if session is not None:
                root, kind = session.root, session.root_kind
            elif app.kind == "book":
                root, kind = app.repo, "book"
            else:
                from tools.repo_files import resolve_root

                root, kind = str(resolve_root(app.repo or ".")), app.kind
            turn = Turn(question, root, kind, session, model=app.model, params=app.params,
                        max_steps=app.max_steps)  # fmt: skip
            self.choice.pack(self.conversation, turn, history, Report(post))
            self.conversation.open(session, Report(post))
            record = self._ui(start_record, app.sessions.store, turn)
            self._generate(turn, post, record)
        except Exception as e:
            # a user error is its line; a bug too, named, keeping the UI alive
            if record is not None:
                self._ui(fail_record, record)
            known = isinstance(e, user_errors())
            post(LogMessage(str(e) if known else f"{type(e).__name__}: {e}", "error"))
            post(TurnFinished(None, None, "error"))
            self._ui(self._idle)
            return
        saved = self._ui(self.save, turn, record)
        post(TurnFinished(turn.usage, backend.window, turn.status))
        if turn.status == "interrupted":
            post(LogMessage("interrupted; the partial answer is kept", "info"))
        elif turn.result.finish_reason == "length":  # a cut answer must not read as whole
            tokens = turn.usage.get("completion_tokens")
            post(LogMessage(f"[the answer was cut at {tokens} tokens, the max_tokens limit: "
                            "/set max_tokens N for longer answers]", "info"))  # fmt: skip
        if saved is not None:
            self._ui(self.app._update_label)
        self._ui(self._idle)

    def _backend(self, post):
        """The backend over the app's engine, loading the engine with the first turn; or the
        remote backend, connected with the first turn."""
        from agentctx.backend import EmbeddedBackend

        app = self.app
        if app.connect is not None:
            if self.conversation.backend is None:
                post(LogMessage("connecting to the backend..."))
                self.conversation.backend = app.connect()
                app.model = self.conversation.backend.model
            return self.conversation.backend
        if app.engine is None:
            post(LogMessage(f"loading model {app.model or '(default)'}..."))
            app.engine = app.engine_factory(app.model)
        backend = self.conversation.backend
        if backend is None or backend.engine is not app.engine:
            self.conversation.backend = backend = EmbeddedBackend(app.engine)
        return backend

    def _generate(self, turn: Turn, post, record=None) -> None:
        """Run the turn (tool calls included), reporting to the chat screen and writing to
        `record` as it streams; Esc cancels the step that is streaming."""

        def started(stream) -> None:
            self._stream = stream
            if self._cancel:  # Esc came while packing or between steps
                stream.cancel()

        writes = MainThreadRecord(record, self._ui) if record is not None else None
        result = self.conversation.run(turn, TurnOutput(self.app, post), writes, started)
        self._stream = None
        post(AnswerUpdate(result.answer))
        turn.status = "interrupted" if result.finish_reason == "cancelled" else "complete"

    def _ui(self, fn, *args):
        """Run fn on the UI thread and return its result; None once the app has closed."""
        try:
            return self.app.call_from_thread(fn, *args)
        except RuntimeError:  # the app is gone (quit during a turn)
            return None

    def _idle(self) -> None:
        self.app.busy, self.app.streaming = False, False

    def save(self, turn: Turn, record=None):
        """Store the turn (main thread): its answer in `record` where its question is
        stored already, else the whole turn. The session, or None when the store refused
        it: then it is kept, to store before the next question, so the store keeps the
        chat's turns."""
        app = self.app
        try:
            if record is None:
                app.session = self.conversation.save(app.sessions.store, turn)
            else:
                app.session = record.finish(turn.result, turn.status)
                self.conversation.stored_as(app.session.id, turn)
        except user_errors() as e:
            self.unsaved = (turn, record)
            app.chat.add_line(f"could not store the turn: {e}; it is kept, to store before "
                              "the next question", "error")  # fmt: skip
            return None
        self.unsaved = None
        try:
            app.sampling.stored(app.session)
        except user_errors() as e:  # the turn is stored; only the /set changes are not
            app.chat.add_line(f"this session's settings were not stored: {e}", "error")
        return app.session

    def store_unsaved(self) -> bool:
        """Store the turn the store refused before; False while it still cannot."""
        return self.unsaved is None or self.save(*self.unsaved) is not None

    def drop_unsaved(self) -> None:
        """Leaving the chat of a turn the store refused: one more try, else say it is lost."""
        if self.unsaved is not None and not self.store_unsaved():
            self.unsaved = None
            self.app.chat.add_line("the turn that could not be stored is dropped", "error")

    def cancel(self) -> None:
        if not self.app.busy:
            return
        self._cancel = True
        if self._stream is not None:
            self._stream.cancel()  # safe from this thread

    def close_session(self) -> None:
        """Save the engine session's KV as its stored session's snapshot, then unpin it (off
        the main thread: off_main_thread says why)."""
        output = Report(self.app.chat.post_message)
        off_main_thread(lambda: self.conversation.close(output))

    def load_model(self, name: str) -> None:
        self.app.busy = True
        self.app.run_worker(partial(self._load, name), thread=True, exclusive=True, group="turn")

    def _load(self, name: str) -> None:
        app, post = self.app, self.app.chat.post_message
        post(LogMessage(f"loading model {name}..."))
        try:
            engine = app.engine_factory(name)
            if engine.tokenizer is None:
                raise ValueError("it has no tokenizer (a dummy model, say): it cannot chat")
        except Exception as e:
            post(LogMessage(f"could not load {name}: {e}", "error"))
        else:
            self._ui(self.close_session)
            app.engine, app.model = engine, name
            post(LogMessage(f"model {name} loaded"))
        self._ui(self._idle)

    def shutdown(self) -> None:
        """On exit: cancel the stream, snapshot the KV (the screen is gone) and unpin it."""
        if self._stream is not None:
            self._stream.cancel()
        self.conversation.close(Silent())
