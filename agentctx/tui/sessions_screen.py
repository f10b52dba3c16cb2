"""The session list (resume, rename, delete) and its two dialogs: the rename box and the
yes / no question. What they change goes through the App."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Label

from sessions.errors import StoreError

if TYPE_CHECKING:
    from agentctx.tui.app import AgentApp


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
