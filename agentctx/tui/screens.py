"""Screens: the chat (the session list and its dialogs are in sessions_screen.py). Screens
compose widgets and react to messages; what they change goes through the App."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer

from agentctx.tui.chat_log import ChatLog
from agentctx.tui.completion import Completion, complete
from agentctx.tui.prompt_input import PromptInput
from agentctx.tui.sessions_screen import ConfirmScreen, RenameScreen, SessionsScreen
from agentctx.tui.state import question_of
from agentctx.tui.turn_messages import (
    AnswerUpdate,
    LogMessage,
    PrefillUpdate,
    ToolCalled,
    TurnFinished,
)
from agentctx.tui.turn_status import TurnStatus
from agentctx.tui.turn_view import TurnView
from agentctx.tui.widgets import ContextMeter

if TYPE_CHECKING:
    from agentctx.tui.app import AgentApp

# the session screens and the turn's messages are re-exported for the imports of their old place
__all__ = ["AnswerUpdate", "ChatScreen", "ConfirmScreen", "LogMessage", "PrefillUpdate",
           "RenameScreen", "SessionsScreen", "ToolCalled", "TurnFinished"]  # fmt: skip


# -- chat --------------------------------------------------------------------------------

PLACEHOLDER = "Ask about the repository, or /help (Enter sends, Shift-Enter or Ctrl-J: new line)"


class ChatScreen(TurnView, Screen):
    """The chat: the header (context meter), the log, the input; what a running turn
    reports reaches them through TurnView."""

    app: AgentApp
    BINDINGS = [
        Binding("escape", "cancel", "Cancel answer", priority=True),
        Binding("ctrl+s", "slash('/sessions')", "Sessions"),
        Binding("ctrl+n", "slash('/new')", "New session"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.meter = ContextMeter(id="meter")
        self.status = TurnStatus(id="phase")
        self.log_view = ChatLog(id="log")
        self.prompt = PromptInput(completer=self.complete, id="prompt", placeholder=PLACEHOLDER)

    def compose(self) -> ComposeResult:
        with Horizontal(id="header"):
            yield self.status
            yield self.meter
        yield self.log_view
        yield self.prompt
        yield Footer()

    def on_mount(self) -> None:
        self.prompt.focus()

    # what the App asks of the screen

    def clear(self) -> None:
        self.log_view.clear()
        self.meter.set_usage(None, None)
        self.prompt.sent.reset()

    def add_user(self, text: str) -> None:
        """A question asked: its turn starts."""
        self.log_view.add_user(text)
        self.status.start()

    def add_line(self, text: str, kind: str = "info", markdown: bool = False) -> None:
        self.log_view.add_line(text, kind, markdown)

    def show_messages(self, messages: list, tool_calls: list = ()) -> None:
        """Put a stored session's messages and tool calls in the log; the meter shows its
        last answer's usage."""
        self.clear()
        self.log_view.show_messages(messages, tool_calls)
        # Up recalls the session's questions, as sent before a restart
        self.prompt.sent.reset(question_of(m.content) for m in messages if m.role == "user")
        last = next((m for m in reversed(messages) if m.role == "assistant"), None)
        if last is not None and last.timings:
            self.meter.set_usage(last.timings, self.app.window)

    # input

    @on(PromptInput.Submitted, "#prompt")
    def submitted(self, event: PromptInput.Submitted) -> None:
        text = event.value.strip()
        if text and self.app.busy and text.split()[0] not in ("/help", "/context"):
            # kept in the box, to send once the answer ends
            self.add_line("an answer is running: what you typed stays in the box; Enter sends "
                          "it once the answer ends, Esc cancels the answer", "error")  # fmt: skip
            return
        event.prompt.value = ""
        if not text:
            return
        event.prompt.sent.add(text)
        if text.startswith("/"):
            self.app.run_slash(text)
        else:
            self.app.ask(text)

    def complete(self, before: str) -> Completion | None:
        """Tab in the input: slash commands, and paths under the session's repository."""
        app = self.app
        commands = [f"/{name[4:]}" for name in dir(app.commands) if name.startswith("cmd_")]
        if app.session is not None:
            root = app.session.root if app.session.root_kind == "repo" else None
        else:
            root = None if app.kind == "book" else (app.repo or ".")
        return complete(before, commands, root)

    def action_cancel(self) -> None:
        self.app.cancel_turn()

    def action_slash(self, line: str) -> None:
        self.app.run_slash(line)
