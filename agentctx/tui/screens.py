"""Screens: the chat, the session list, the rename dialog and the yes / no question. Screens
compose widgets and react to messages; what they change goes through the App."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Label

from agentctx.tui.chat_log import ChatLog
from agentctx.tui.widgets import ContextMeter
from sessions.errors import StoreError

if TYPE_CHECKING:
    from agentctx.tui.app import AgentApp


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


# -- sessions ----------------------------------------------------------------------------


class SessionsScreen(Screen):
    app: AgentApp
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
    ]

    def compose(self) -> ComposeResult:
        yield Label("Sessions  (Enter resume · r rename · d delete · Esc back)", id="title")
        yield DataTable(id="sessions", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("id", "name", "updated", "messages")
        self.reload()
        table.focus()

    def reload(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for s in self.app.sessions.list():
            updated = s.updated[:16].replace("T", " ")
            # Text cells: a plain str is read as Rich markup ("[/]" in a name crashed this)
            cells = (s.id, s.name or "", updated, str(s.message_count))
            table.add_row(*(Text(c) for c in cells), key=s.id)

    def selected(self) -> str | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    @on(DataTable.RowSelected)
    def resume(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.app.pop_screen()
            self.app.resume(event.row_key.value)

    def action_rename(self) -> None:
        ref = self.selected()
        if ref is None:
            return

        def done(name: str | None) -> None:
            if name is not None:
                self.app.rename_session(ref, name)
                self.reload()

        try:
            current = self.app.sessions.get(ref).name or ""
        except StoreError as e:  # deleted by another agentctx, a locked store
            self.app.notify(str(e), severity="error")
            self.reload()
            return
        self.app.push_screen(RenameScreen(current), done)

    def action_delete(self) -> None:
        """Asks first (y deletes; n or Esc keeps it): a session's messages go for good."""
        ref = self.selected()
        if ref is None:
            return
        try:
            s = self.app.sessions.get(ref)
        except StoreError as e:  # deleted by another agentctx, a locked store
            self.app.notify(str(e), severity="error")
            self.reload()
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.app.delete_session(ref)
                self.reload()

        name = f" {s.name!r}" if s.name else ""
        self.app.push_screen(
            ConfirmScreen(f"Delete session {s.id}{name} and its {s.message_count} messages?"),
            done,
        )


class ConfirmScreen(ModalScreen[bool]):
    """A yes / no question: y answers yes; n and Esc answer no."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(Text(self.question))
            yield Label("y: yes · n or Esc: no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class RenameScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "dismiss", "Cancel")]

    def __init__(self, name: str) -> None:
        super().__init__()
        self.current = name

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label("New name (Enter to save, Esc to cancel)")
            yield Input(value=self.current, id="name")

    @on(Input.Submitted, "#name")
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)
