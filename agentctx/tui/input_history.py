"""The lines sent from the chat's input, walked with Up and Down as a shell's history is."""

from __future__ import annotations

from collections.abc import Iterable


class InputHistory:
    """Lines sent before, oldest first. Walking back keeps the line being typed (the draft),
    and walking forward past the newest line gives it back."""

    def __init__(self, lines: Iterable[str] = ()) -> None:
        self.lines: list[str] = []
        self.reset(lines)

    def reset(self, lines: Iterable[str] = ()) -> None:
        """Start again from `lines` (a session's questions, say)."""
        self.lines = []
        for line in lines:
            self.add(line)
        self.draft = ""

    def add(self, line: str) -> None:
        """A line was sent: it becomes the newest (once, when sent twice in a row)."""
        if line.strip() and (not self.lines or self.lines[-1] != line):
            self.lines.append(line)
        self.pos = len(self.lines)  # past the newest: the draft
        self.draft = ""

    def back(self, current: str) -> str | None:
        """The line before the one shown (`current`), or None at the oldest."""
        if self.pos == 0:
            return None
        if self.pos == len(self.lines):
            self.draft = current
        self.pos -= 1
        return self.lines[self.pos]

    def forward(self) -> str | None:
        """The line after the one shown, the draft past the newest, or None when the draft
        is shown already."""
        if self.pos >= len(self.lines):
            return None
        self.pos += 1
        return self.draft if self.pos == len(self.lines) else self.lines[self.pos]
