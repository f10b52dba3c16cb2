"""The agentctx TUI: chat about a repository, with answers streaming from the local model.

The App owns the shared state (engine, current session, repository) and the one storage
object; screens ask it to act. Its turns run in agentctx.tui.turns: generation in a worker
thread that reports back through messages posted to the chat screen; the store is only
touched on the main thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import App

from agentctx.tui.errors import user_errors
from agentctx.tui.screens import ChatScreen
from agentctx.tui.session_settings import SessionSettings
from agentctx.tui.slash_commands import SlashCommands
from agentctx.tui.state import SessionService
from agentctx.tui.turns import TurnRunner

STORE_WAIT_MS = 2000  # how long the UI waits for a store another agentctx is writing


class AgentApp(App):
    TITLE = "agentctx"
    CSS = """
    #header { dock: top; height: auto; background: $panel; }
    #phase { width: auto; max-width: 45%; height: auto; padding: 0 1; color: $accent; text-style: bold; }
    #meter { width: 1fr; height: auto; color: $text-muted; padding: 0 1; }
    #log { height: 1fr; padding: 0 1; }
    #prompt { height: auto; max-height: 8; }  /* grows with its lines, under the log */
    .user { margin: 1 0 0 0; color: $accent; text-style: bold; }
    .assistant { margin: 0; padding: 0; }
    .assistant.interrupted { border-left: thick $warning; }
    .info, .summary { color: $text-muted; }
    .check { color: $warning; }
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
        connect: Callable[[], Any] | None = None,
        kind: str = "repo",
        resume: str | None = None,
    ) -> None:
        super().__init__()
        from agentctx.sampling_settings import config_settings, resolve

        self.repo = repo  # what the next new session reads (None: the current directory)
        self.kind = kind  # "repo", or "book" (tui --book, /book FILE)
        self.resume_at_start = resume  # a session to open on start (tui -c, --session)
        self.model = model
        self.engine_factory = engine_factory or _load_engine
        self.engine = None  # loaded by the first turn
        # with a remote backend (tui --backend): connects with the first turn, and every
        # turn runs there; the model is the server's
        self.connect = connect
        if store is None:
            from sessions.store import SessionStore

            # a short wait for a store another agentctx holds: the UI thread waits on it
            store = SessionStore(busy_timeout_ms=STORE_WAIT_MS)
        self.sessions = SessionService(store)
        # config.json's "sampling" over the defaults (a light repetition penalty: the 135M
        # model loops without it); max_steps: tool steps a turn may take (tool-capable models)
        defaults, self.max_steps = resolve(config_settings())
        self.params = params or defaults
        self.sampling = SessionSettings(self)  # with the session's /set changes on top
        self.session = None  # the current stored session; None: the next question starts one
        self.busy = False
        self.streaming = False  # the answer's first token has arrived
        self.turns = TurnRunner(self)  # the turn runner, with the session's pinned KV
        self.commands = SlashCommands(self)

    @property
    def window(self) -> int | None:
        if self.connect is not None:
            backend = self.turns.conversation.backend
            return backend.window if backend is not None else None
        return self.engine.max_model_len if self.engine is not None else None

    @property
    def chat(self) -> ChatScreen:
        return self._chat

    def on_mount(self) -> None:
        self._chat = ChatScreen()
        self.push_screen(self._chat)
        if self.resume_at_start is not None:
            self.call_after_refresh(self.resume, self.resume_at_start)
        self.call_after_refresh(self._update_label)

    def _update_label(self) -> None:
        from pathlib import Path

        where = self.session.root if self.session is not None else (self.repo or ".")
        name = Path(where).name or where
        sid = self.session.id if self.session is not None else "new session"
        self.chat.meter.set_label(f"{name} · {sid}")

    # -- asking (agentctx.tui.turns) --------------------------------------------------------

    def ask(self, question: str) -> None:
        self.turns.ask(question)

    def cancel_turn(self) -> None:
        self.turns.cancel()

    # -- sessions -------------------------------------------------------------------------

    def resume(self, ref: str) -> None:
        if self.busy:
            self.chat.add_line("an answer is running: wait, or press Esc to cancel", "error")
            return
        self.turns.drop_unsaved()
        try:
            target = self.sessions.get(ref)
            if self.session is None or target.id != self.session.id:
                self.turns.close_session()
            self.session = target
            self.chat.show_messages(
                self.sessions.messages(self.session.id), self.sessions.tool_calls(self.session.id)
            )
            self.sampling.restore(target)
        except user_errors() as e:
            self.chat.add_line(str(e), "error")
        else:
            self._use_session_model(self.session.model)
        self._update_label()

    def _use_session_model(self, stored: str | None) -> None:
        """A resumed session goes on with the model it was started with."""
        wanted = None if stored in (None, "", "default") else stored
        if self.connect is not None:  # the backend's model serves every session
            return
        if wanted != self.model:
            self.turns.close_session()
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
            self.turns.conversation.owner = None  # nothing to save for a deleted session
            self.new_session()
        try:
            kv_snapshots.remove(s.id)
        except OSError as e:  # the session is gone; only its snapshot file stays
            self.notify(f"its KV snapshot was not removed: {e.strerror or e}", severity="warning")

    def new_session(self) -> None:
        self.turns.drop_unsaved()
        self.turns.close_session()
        self.session = None
        self.sampling.reset()
        self.chat.clear()
        self._update_label()

    # -- slash commands -------------------------------------------------------------------

    def run_slash(self, line: str) -> None:
        self.commands.run(line)

    def _session_gone(self, error: Exception) -> None:
        """The current session cannot be read from the store (deleted by another agentctx,
        say): say so and start a new one."""
        self.turns.conversation.owner = None
        self.new_session()
        self.chat.add_line(f"that session cannot be read any more ({error}); this is a new "
                           "one", "error")  # fmt: skip

    # -- shutdown -------------------------------------------------------------------------

    def on_unmount(self) -> None:
        self.turns.shutdown()


def _load_engine(model: str | None):
    from agentctx.models import resolve_model
    from engine import Engine

    return Engine.load(resolve_model(model))
