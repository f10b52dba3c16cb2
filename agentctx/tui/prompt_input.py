"""The chat's input box: several lines (pasted, or Shift-Enter / Ctrl-J), Enter sends, Up
and Down walk the lines sent before, Tab completes commands and paths."""

from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from agentctx.tui.completion import Completion
from agentctx.tui.input_history import InputHistory

NEWLINE_KEYS = ("shift+enter", "ctrl+j")  # (many terminals send Ctrl-J for Shift-Enter)
MAX_SHOWN_OPTIONS = 12  # completions listed under the box


class PromptInput(TextArea):
    """A TextArea that sends its text on Enter. `completer(before)` completes the text
    before the cursor (agentctx.tui.completion)."""

    BINDINGS = [Binding("tab", "complete", "Complete", show=False)]

    class Submitted(Message):
        def __init__(self, prompt: PromptInput, value: str) -> None:
            super().__init__()
            self.prompt, self.value = prompt, value

        @property
        def control(self) -> PromptInput:
            return self.prompt

    def __init__(
        self, completer: Callable[[str], Completion | None] | None = None, **kwargs
    ) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, **kwargs)
        self.sent = InputHistory()  # (TextArea.history is its undo history)
        self.completer = completer
        self._options_for: str | None = None  # the text the completions shown are for

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if self.text != self._options_for:  # the completions shown are for an earlier text
            self.border_subtitle, self._options_for = "", None

    # history: Up on the first line, Down on the last

    def action_cursor_up(self, select: bool = False) -> None:
        if select or not self._on_first_row():
            return super().action_cursor_up(select)
        line = self.sent.back(self.text)
        if line is not None:
            self.value = line

    def action_cursor_down(self, select: bool = False) -> None:
        if select or not self._on_last_row():
            return super().action_cursor_down(select)
        line = self.sent.forward()
        if line is not None:
            self.value = line

    def _on_first_row(self) -> bool:
        # (rows as shown: a long line wraps onto several)
        return self._row() == 0

    def _on_last_row(self) -> bool:
        return self._row() >= self.wrapped_document.height - 1

    def _row(self) -> int:
        return self.wrapped_document.location_to_offset(self.cursor_location).y

    # completion

    def action_complete(self) -> None:
        if self.completer is None:
            return
        before = self.document.get_text_range((0, 0), self.cursor_location)
        done = self.completer(before)
        if done is None:
            self.app.bell()
            return
        if done.text != done.word:
            row, col = self.cursor_location
            self.replace(done.text, (row, col - len(done.word)), (row, col))
        if len(done.options) > 1:
            shown = done.options[:MAX_SHOWN_OPTIONS]
            more = len(done.options) - len(shown)
            self.border_subtitle = "  ".join(shown) + (f"  (+{more})" if more else "")
            self._options_for = self.text
