"""The chat's log: questions, answers (one streaming at a time), tool calls and lines of
information, in the order they happened."""

from __future__ import annotations

from textual.containers import VerticalScroll

from agentctx.agent import ToolCallRecord
from agentctx.tui.state import question_of
from agentctx.tui.widgets import AssistantMessage, LogLine, ToolCallPanel, UserMessage


class ChatLog(VerticalScroll):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.answer: AssistantMessage | None = None  # the one streaming now

    def clear(self) -> None:
        self.answer = None
        self.remove_children()

    def add_user(self, text: str) -> None:
        self._append(UserMessage(text))

    def add_line(self, text: str, kind: str = "info", markdown: bool = False) -> None:
        self._append(AssistantMessage(text, kind) if markdown else LogLine(text, kind))

    def add_tool_call(self, label: str, output: str, error: bool = False) -> None:
        self.answer = None  # the next step's text starts a new answer block
        self._append(ToolCallPanel(label, output, error))

    def show_messages(self, messages: list, tool_calls: list = ()) -> None:
        """A stored session's messages and tool calls (the system prompt is not shown)."""
        by_message: dict = {}
        for t in tool_calls:
            by_message.setdefault(t.message_id, []).append(t)
        for m in messages:
            if m.role == "user":
                self.add_user(question_of(m.content))
            elif m.role == "assistant":
                if m.content or not by_message.get(m.id):
                    self._append(AssistantMessage(m.content, m.status))
                for t in by_message.get(m.id, []):
                    call = ToolCallRecord(t.name, t.arguments, t.result, t.error)
                    self.add_tool_call(call.label(), call.output or "", t.error is not None)

    def stream_answer(self, text: str) -> None:
        """The streaming answer so far: its block is made with its first text."""
        if self.answer is None:
            self.answer = AssistantMessage()
            self._append(self.answer)
        self.answer.set_text(text)
        self.scroll_end(animate=False)

    def answer_text(self) -> str:
        """The streaming answer's text so far ("" when none streams)."""
        return self.answer.text if self.answer is not None else ""

    def end_answer(self, status: str) -> None:
        if status == "interrupted" and self.answer is not None:
            self.answer.add_class("interrupted")
        self.answer = None

    def _append(self, widget) -> None:
        self.mount(widget)
        self.scroll_end(animate=False)
