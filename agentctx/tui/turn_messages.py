"""The messages a turn's worker posts to the chat screen (post_message is thread-safe)."""

from __future__ import annotations

from textual.message import Message


class LogMessage(Message):
    def __init__(self, text: str, kind: str = "info", markdown: bool = False) -> None:
        super().__init__()
        self.text, self.kind, self.markdown = text, kind, markdown


class PrefillUpdate(Message):
    def __init__(self, done: int, total: int, tok_s: float) -> None:
        super().__init__()
        self.done, self.total, self.tok_s = done, total, tok_s


class AnswerUpdate(Message):
    """The whole answer so far (throttled by the sender), with the tokens streamed so far in
    this step and their rate."""

    def __init__(self, text: str, tokens: int = 0, tok_s: float = 0.0) -> None:
        super().__init__()
        self.text, self.tokens, self.tok_s = text, tokens, tok_s


class PhaseUpdate(Message):
    """What the turn does now, in a few words ("tool read_file", say)."""

    def __init__(self, phase: str) -> None:
        super().__init__()
        self.phase = phase


class ToolCalled(Message):
    """A tool call ran (its result is in): the step's text so far is final."""

    def __init__(self, label: str, output: str, error: bool) -> None:
        super().__init__()
        self.label, self.output, self.error = label, output, error


class TurnFinished(Message):
    def __init__(self, usage: dict | None, window: int | None, status: str) -> None:
        super().__init__()
        self.usage, self.window, self.status = usage, window, status
