"""Screens: the chat (the session list and its dialogs are in sessions_screen.py). Screens
compose widgets and react to messages; what they change goes through the App."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input

from agentctx.tui.chat_log import ChatLog
from agentctx.tui.sessions_screen import ConfirmScreen, RenameScreen, SessionsScreen
from agentctx.tui.widgets import ContextMeter

if TYPE_CHECKING:
    from agentctx.tui.app import AgentApp

# the session screens are re-exported for the imports of their old place
__all__ = ["ChatScreen", "ConfirmScreen", "RenameScreen", "SessionsScreen"]


# -- messages a turn's worker posts to the chat screen (post_message is thread-safe) -------


class LogMessage(Message):
    def __init__(self, text: str, kind: str = "info", markdown: bool = False) -> None:
        super().__init__()
        self.text, self.kind, self.markdown = text, kind, markdown


class PrefillUpdate(Message):
    def __init__(self, done: int, total: int, tok_s: float) -> None:
        super().__init__()
        self.done, self.total, self.tok_s = done, total, tok_s


class AnswerUpdate(Message):
    """The whole answer so far (throttled by the sender)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class ToolCalled(Message):
    """A tool call ran (its result is in): the step's text so far is final."""

    def __init__(self, label: str, output: str, error: bool) -> None:
        super().__init__()
        self.label, self.output, self.error = label, output, error


class TurnFinished(Message):
    def __init__(self, usage: dict | None, window: int | None, status: str) -> None:
        super().__init__()
        self.usage, self.window, self.status = usage, window, status


# -- chat --------------------------------------------------------------------------------


class ChatScreen(Screen):
    app: AgentApp
    BINDINGS = [
        Binding("escape", "cancel", "Cancel answer", priority=True),
        Binding("ctrl+s", "slash('/sessions')", "Sessions"),
        Binding("ctrl+n", "slash('/new')", "New session"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.meter = ContextMeter(id="meter")
        self.log_view = ChatLog(id="log")

    def compose(self) -> ComposeResult:
        yield self.meter
        yield self.log_view
        yield Input(placeholder="Ask about the repository, or /help", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    # what the App asks of the screen

    def clear(self) -> None:
        self.log_view.clear()
        self.meter.set_usage(None, None)

    def add_user(self, text: str) -> None:
        self.log_view.add_user(text)

    def add_line(self, text: str, kind: str = "info", markdown: bool = False) -> None:
        self.log_view.add_line(text, kind, markdown)

    def show_messages(self, messages: list, tool_calls: list = ()) -> None:
        """Put a stored session's messages and tool calls in the log; the meter shows its
        last answer's usage."""
        self.clear()
        self.log_view.show_messages(messages, tool_calls)
        last = next((m for m in reversed(messages) if m.role == "assistant"), None)
        if last is not None and last.timings:
            self.meter.set_usage(last.timings, self.app.window)

    # input

    @on(Input.Submitted, "#prompt")
    def submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if text and self.app.busy and text.split()[0] not in ("/help", "/context"):
            # kept in the box, to send once the answer ends
            self.add_line("an answer is running: what you typed stays in the box; Enter sends "
                          "it once the answer ends, Esc cancels the answer", "error")  # fmt: skip
            return
        event.input.value = ""
        if not text:
            return
        if text.startswith("/"):
            self.app.run_slash(text)
        else:
            self.app.ask(text)

    def action_cancel(self) -> None:
        self.app.cancel_turn()

    def action_slash(self, line: str) -> None:
        self.app.run_slash(line)

    # what a turn's worker reports

    @on(LogMessage)
    def logged(self, event: LogMessage) -> None:
        self.add_line(event.text, event.kind, event.markdown)

    @on(PrefillUpdate)
    def prefilled(self, event: PrefillUpdate) -> None:
        self.meter.set_prefill(event.done, event.total, event.tok_s, self.app.window)

    @on(AnswerUpdate)
    def answered(self, event: AnswerUpdate) -> None:
        self.log_view.stream_answer(event.text)

    @on(ToolCalled)
    def tool_called(self, event: ToolCalled) -> None:
        self.log_view.add_tool_call(event.label, event.output, event.error)

    @on(TurnFinished)
    def finished(self, event: TurnFinished) -> None:
        self.log_view.end_answer(event.status)
        if event.usage is not None:
            self.meter.set_usage(event.usage, event.window)
        else:
            self.meter.set_prefill(1, 1, 0.0)  # clear the progress
