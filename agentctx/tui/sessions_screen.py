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
    """Every session, newest first: its title, what it reads, its model, its turns and its
    last use; ● marks the current one. `/` filters the rows by title, name or repository."""

    app: AgentApp
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("slash", "filter", "Filter"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
    ]

    def compose(self) -> ComposeResult:
        yield Label(
            "Sessions  (Enter resume · / filter · r rename · d delete · Esc back)", id="title"
        )
        yield Input(placeholder="filter: title, name or repository", id="filter")
        yield DataTable(id="sessions", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#filter").display = False
        table = self.query_one(DataTable)
        table.add_columns(" ", "title", "reads", "model", "turns", "last use", "id")
        self.reload()
        table.focus()

    def reload(self) -> None:
        """The rows again from the store, the filter kept."""
        self.all = self.app.sessions.list()
        self.show(self.query_one("#filter", Input).value)

    def show(self, text: str) -> None:
        table = self.query_one(DataTable)
        table.clear()
        current = self.app.session.id if self.app.session is not None else None
        for s in self.all:
            if text and not _matches(s, text):
                continue
            # Text cells: a plain str is read as Rich markup ("[/]" in a name crashed this)
            cells = ("●" if s.id == current else "", _cut(s.label, 40), _reads(s), s.model,
                     str(s.turns), s.updated[:16].replace("T", " "), s.id)  # fmt: skip
            table.add_row(*(Text(c) for c in cells), key=s.id)

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#filter")
    def filtered(self, event: Input.Changed) -> None:
        self.show(event.value)

    @on(Input.Submitted, "#filter")
    def filter_done(self, event: Input.Submitted) -> None:
        self.query_one(DataTable).focus()

    def action_back(self) -> None:
        """Esc: out of the filter (cleared) first, then back to the chat."""
        box = self.query_one("#filter", Input)
        if box.display:
            box.value, box.display = "", False
            self.show("")
            self.query_one(DataTable).focus()
        else:
            self.app.pop_screen()

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


def _matches(s, text: str) -> bool:
    wanted = text.casefold()
    return any(wanted in (v or "").casefold() for v in (s.label, s.name, s.title, s.root))


def _reads(s) -> str:
    """The repository's folder name, or "book: FILE"."""
    from pathlib import Path

    name = Path(s.root).name if s.root else ""
    return f"book: {name}" if s.root_kind == "book" else name


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
