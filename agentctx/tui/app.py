"""The agentctx TUI: chat about a repository, with answers streaming from the local model.

The App owns the shared state (engine, current session, repository) and the one storage
object; screens ask it to act. Generation runs in a worker thread that reports back through
messages posted to the chat screen; the store is only touched on the main thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual import work
from textual.app import App

from agentctx.agent import DEFAULT_MAX_STEPS
from agentctx.ask import TurnResult
from agentctx.tui.errors import user_errors
from agentctx.tui.outputs import Report, Silent, TurnOutput
from agentctx.tui.screens import (
    AnswerUpdate,
    ChatScreen,
    LogMessage,
    TurnFinished,
)
from agentctx.tui.slash_commands import SlashCommands
from agentctx.tui.state import SessionService

STORE_WAIT_MS = 2000  # how long the UI waits for a store another agentctx is writing


class AgentApp(App):
    TITLE = "agentctx"
    CSS = """
    #meter { dock: top; height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    #log { height: 1fr; padding: 0 1; }
    #prompt { dock: bottom; }
    .user { margin: 1 0 0 0; color: $accent; text-style: bold; }
    .assistant { margin: 0; padding: 0; }
    .assistant.interrupted { border-left: thick $warning; }
    .info { color: $text-muted; }
    .tool { margin: 0; padding: 0; border: none; background: $boost; }
    .tool-error CollapsibleTitle { color: $error; }
    .tool-output { color: $text-muted; }
    .error { color: $error; }
    #title { padding: 0 1; height: 1; background: $panel; width: 1fr; }
    #sessions { height: 1fr; }
    RenameScreen, ConfirmScreen { align: center middle; }
    #dialog { width: 60; height: auto; border: round $accent; padding: 1 2; background: $surface; }
    """

    def __init__(
        self,
        repo: str | None = None,
        model: str | None = None,
        engine_factory: Callable[[str | None], Any] | None = None,
        store=None,
        params=None,
    ) -> None:
        super().__init__()
        from engine import SamplingParams

        self.repo = repo  # what the next new session reads (None: the current directory)
        self.kind = "repo"  # "repo", or "book" after /book FILE
        self.model = model
        self.engine_factory = engine_factory or _load_engine
        self.engine = None  # loaded by the first turn
        if store is None:
            from sessions.store import SessionStore

            # a short wait for a store another agentctx holds: the UI thread waits on it
            store = SessionStore(busy_timeout_ms=STORE_WAIT_MS)
        self.sessions = SessionService(store)
        self._unsaved: tuple | None = None  # a turn the store refused (locked): kept to retry
        # a light repetition penalty: the 135M default model loops without it
        self.params = params or SamplingParams(max_tokens=400, repetition_penalty=1.1)
        self.max_steps = DEFAULT_MAX_STEPS  # tool steps a turn may take (tool-capable models)
        self.session = None  # the current stored session; None: the next question starts one
        self.busy = False
        self.streaming = False  # the answer's first token has arrived
        self._stream = None
        self._cancel = False
        self.es = None  # the engine session (pinned KV) of the current session
        self.es_owner: str | None = None  # its stored session's id; None: not stored yet
        self.commands = SlashCommands(self)

    @property
    def window(self) -> int | None:
        return self.engine.max_model_len if self.engine is not None else None

    @property
    def chat(self) -> ChatScreen:
        return self._chat

    def on_mount(self) -> None:
        self._chat = ChatScreen()
        self.push_screen(self._chat)
        self.call_after_refresh(self._update_label)

    def _update_label(self) -> None:
        from pathlib import Path

        where = self.session.root if self.session is not None else (self.repo or ".")
        name = Path(where).name or where
        sid = self.session.id if self.session is not None else "new session"
        self.chat.meter.set_label(f"{name} · {sid}")

    # -- asking ---------------------------------------------------------------------------

    def ask(self, question: str) -> None:
        if self.busy:
            self.chat.add_line("an answer is running: wait, or press Esc to cancel", "error")
            return
        try:
            question.encode("utf-8")
        except UnicodeEncodeError:
            self.chat.add_line("the question has text that is not valid UTF-8", "error")
            return
        if not self._store_unsaved():
            self.chat.add_line("the last turn is not stored yet: ask again when the session "
                               "store is free", "error")  # fmt: skip
            return
        history = None
        if self.session is not None:
            try:
                history = self.sessions.history(self.session.id)  # store: main thread
            except user_errors() as e:  # deleted by another agentctx, say
                self._session_gone(e)
                return
        self.chat.add_user(question)
        self.busy, self.streaming, self._cancel = True, False, False
        self._turn(question, history, self.session)

    @work(thread=True, exclusive=True, group="turn")
    def _turn(self, question: str, history: list[dict] | None, session) -> None:
        post = self.chat.post_message
        try:
            engine = self._engine(post)
            root, packed = session.root if session is not None else None, None
            kind = session.root_kind if session is not None else self.kind
            if history is not None:
                messages = history + [{"role": "user", "content": question}]
            else:
                from agentctx.ask import new_session_messages
                from tools.repo_files import resolve_root

                book = self.kind == "book"
                root = self.repo if book else str(resolve_root(self.repo or "."))
                messages, packed = new_session_messages(
                    engine, root, question, self.params, None, Report(post), self.kind
                )
            es = self._engine_session(engine, session, post)
            result, status = self._generate(engine, messages, root, kind, post, es)
        except user_errors() as e:
            post(LogMessage(str(e), "error"))
            post(TurnFinished(None, None, "error"))
            self._ui(self._idle)
            return
        except Exception as e:  # a bug: keep the UI alive and say what happened
            post(LogMessage(f"{type(e).__name__}: {e}", "error"))
            post(TurnFinished(None, None, "error"))
            self._ui(self._idle)
            return
        saved = self._ui(self._save, session, root, messages, packed, result, status)
        post(TurnFinished(result.usage, engine.max_model_len, status))
        if status == "interrupted":
            post(LogMessage("interrupted; the partial answer is kept", "info"))
        elif result.finish_reason == "length":  # a cut answer must not read as whole
            tokens = result.usage.get("completion_tokens")
            post(LogMessage(f"[the answer was cut at {tokens} tokens, the max_tokens limit: "
                            "/set max_tokens N for longer answers]", "info"))  # fmt: skip
        if saved is not None:
            self._ui(self._update_label)
        self._ui(self._idle)

    def _engine_session(self, engine, session, post):
        """The engine session of the current stored session (worker thread): kept open
        between turns so follow-ups reuse the KV; opened from its snapshot on resume."""
        owner = session.id if session is not None else None
        if self.es is not None and self.es_owner == owner and self.es.engine is engine:
            return self.es
        from agentctx.ask import open_engine_session

        self.es, self.es_owner = open_engine_session(engine, session, Report(post)), owner
        return self.es

    def _close_engine_session(self) -> None:
        """Save the engine session's KV as its stored session's snapshot, then unpin it."""
        es, owner = self.es, self.es_owner
        self.es = self.es_owner = None
        if es is None:
            return
        if owner is not None and not es.busy:
            from agentctx.ask import save_kv

            save_kv(es, owner, Report(self.chat.post_message))
        es.close()

    def _generate(
        self, engine, messages: list[dict], root, kind, post, es=None
    ) -> tuple[TurnResult, str]:
        """Run the turn (agentctx.ask.run_turn, tool calls included), reporting to the chat
        screen; Esc cancels the step that is streaming."""
        from agentctx.ask import run_turn

        def started(stream) -> None:
            self._stream = stream
            if self._cancel:  # Esc came while packing or between steps
                stream.cancel()

        out = TurnOutput(self, post)
        result = run_turn(
            engine, messages, self.params, out, root, kind, self.max_steps, started, es
        )
        self._stream = None
        post(AnswerUpdate(result.answer))
        status = "interrupted" if result.finish_reason == "cancelled" else "complete"
        return result, status

    def _ui(self, fn, *args):
        """Run fn on the UI thread and return its result; None once the app has closed."""
        try:
            return self.call_from_thread(fn, *args)
        except RuntimeError:  # the app is gone (quit during a turn)
            return None

    def _engine(self, post):
        if self.engine is None:
            post(LogMessage(f"loading model {self.model or '(default)'}..."))
            self.engine = self.engine_factory(self.model)
        return self.engine

    def _save(self, session, root, messages, packed, result, status, kind=None):
        kind = kind or (session.root_kind if session is not None else self.kind)
        try:
            self.session = self.sessions.save_turn(
                session, root, self.model, messages, packed, result, status, kind
            )
        except user_errors() as e:
            # kept: stored before the next question (ask), so the store keeps the chat's turns
            self._unsaved = (session, root, messages, packed, result, status, kind)
            self.chat.add_line(f"could not store the turn: {e}; it is kept, to store before "
                               "the next question", "error")  # fmt: skip
            return None
        self._unsaved = None
        result.usage["session"] = self.session.id
        if self.es is not None and self.es_owner is None:
            self.es_owner = self.session.id  # the new session's KV is now its own
        return self.session

    def _store_unsaved(self) -> bool:
        """Store the turn the store refused before; False while it still cannot."""
        if self._unsaved is None:
            return True
        return self._save(*self._unsaved) is not None

    def _drop_unsaved(self) -> None:
        """Leaving the chat of a turn the store refused: one more try, else say it is lost."""
        if self._unsaved is not None and not self._store_unsaved():
            self._unsaved = None
            self.chat.add_line("the turn that could not be stored is dropped", "error")

    def _idle(self) -> None:
        self.busy, self.streaming = False, False

    def cancel_turn(self) -> None:
        if not self.busy:
            return
        self._cancel = True
        if self._stream is not None:
            self._stream.cancel()  # safe from this thread

    # -- sessions -------------------------------------------------------------------------

    def resume(self, ref: str) -> None:
        if self.busy:
            self.chat.add_line("an answer is running: wait, or press Esc to cancel", "error")
            return
        self._drop_unsaved()
        try:
            target = self.sessions.get(ref)
            if self.session is None or target.id != self.session.id:
                self._close_engine_session()
            self.session = target
            self.chat.show_messages(
                self.sessions.messages(self.session.id), self.sessions.tool_calls(self.session.id)
            )
        except user_errors() as e:
            self.chat.add_line(str(e), "error")
        else:
            self._use_session_model(self.session.model)
        self._update_label()

    def _use_session_model(self, stored: str | None) -> None:
        """A resumed session goes on with the model it was started with."""
        wanted = None if stored in (None, "", "default") else stored
        if wanted != self.model:
            self._close_engine_session()
            self.model, self.engine = wanted, None
            self.chat.add_line(
                f"this session uses {wanted or 'the default model'}; it loads with the next question"
            )

    def rename_session(self, ref: str, name: str) -> None:
        try:
            s = self.sessions.rename(ref, name)
            if self.session is not None and self.session.id == s.id:
                self.session = s
        except user_errors() as e:
            self.notify(str(e), severity="error")

    def delete_session(self, ref: str) -> None:
        try:
            s = self.sessions.delete(ref)
        except user_errors() as e:
            self.notify(str(e), severity="error")
            return
        from agentctx import kv_snapshots

        if self.session is not None and self.session.id == s.id:
            self.es_owner = None  # nothing to save for a deleted session
            self.new_session()
        try:
            kv_snapshots.remove(s.id)
        except OSError as e:  # the session is gone; only its snapshot file stays
            self.notify(f"its KV snapshot was not removed: {e.strerror or e}", severity="warning")

    def new_session(self) -> None:
        self._drop_unsaved()
        self._close_engine_session()
        self.session = None
        self.chat.clear()
        self._update_label()

    # -- slash commands -------------------------------------------------------------------

    def run_slash(self, line: str) -> None:
        self.commands.run(line)

    @work(thread=True, exclusive=True, group="turn")
    def _load_model(self, name: str) -> None:
        post = self.chat.post_message
        post(LogMessage(f"loading model {name}..."))
        try:
            engine = self.engine_factory(name)
            if engine.tokenizer is None:
                raise ValueError("it has no tokenizer (a dummy model, say): it cannot chat")
        except Exception as e:
            post(LogMessage(f"could not load {name}: {e}", "error"))
        else:
            self._ui(self._close_engine_session)
            self.engine, self.model = engine, name
            post(LogMessage(f"model {name} loaded"))
        self._ui(self._idle)

    def _session_gone(self, error: Exception) -> None:
        """The current session cannot be read from the store (deleted by another agentctx,
        say): say so and start a new one."""
        self.es_owner = None
        self.new_session()
        self.chat.add_line(f"that session cannot be read any more ({error}); this is a new "
                           "one", "error")  # fmt: skip

    # -- shutdown -------------------------------------------------------------------------

    def on_unmount(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
        es = self.es
        if es is not None and self.es_owner is not None and not es.busy:
            from agentctx.ask import save_kv

            save_kv(es, self.es_owner, Silent())  # on exit: the screen is gone
        if es is not None:
            es.close()
        self.es = None


def _load_engine(model: str | None):
    from agentctx.models import resolve_model
    from engine import Engine

    return Engine.load(resolve_model(model))
