"""Where a TUI turn reports: the chat screen's messages, posted from the worker thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agentctx.tui.turn_messages import (
    AnswerUpdate,
    LogMessage,
    PhaseUpdate,
    PrefillUpdate,
    ToolCalled,
)

UPDATE_EVERY_S = 0.05  # at most 20 re-renders of a streaming answer per second


class TurnOutput:
    """Where agentctx.ask.run_turn reports a turn in the TUI: messages to the chat screen,
    with the streaming answer throttled; `tokens`: the pieces of text streamed in this step
    (about one a token), from `first` on."""

    def __init__(self, app, post: Callable[[Any], None]) -> None:
        self.app, self.post = app, post
        self.text_so_far, self.last, self.start = "", 0.0, time.perf_counter()
        self.tokens, self.first = 0, 0.0

    def info(self, line: str) -> None:
        self.post(LogMessage(line))

    def prefill(self, done: int, total: int) -> None:
        rate = done / max(time.perf_counter() - self.start, 1e-6)
        self.post(PrefillUpdate(done, total, rate))

    def text(self, delta: str) -> None:
        self.app.streaming = True
        self.text_so_far += delta
        now = time.perf_counter()
        self.tokens += 1
        self.first = self.first or now
        if now - self.last >= UPDATE_EVERY_S:
            self.post(self._update(now))
            self.last = now

    def _update(self, now: float) -> AnswerUpdate:
        rate = (self.tokens - 1) / (now - self.first) if now > self.first else 0.0
        return AnswerUpdate(self.text_so_far, self.tokens, rate)

    def tool_call(self, call) -> None:
        if self.text_so_far:
            self.post(self._update(time.perf_counter()))
        self.post(PhaseUpdate(f"tool {call.name}"))

    def references(self, refs) -> None:
        from agentctx.references import render

        self.post(LogMessage(render(refs)))

    def tool_result(self, call) -> None:
        self.post(ToolCalled(call.label(), call.output, call.error is not None))
        self._next_step()

    def revising(self, line: str) -> None:
        """The answer so far was checked against the files and is asked for again: it stays
        in the log as it is, the line says why, and the new answer gets a block of its own."""
        if self.text_so_far:
            self.post(self._update(time.perf_counter()))
        self.post(LogMessage(line, "check"))
        self._next_step()

    def _next_step(self) -> None:
        self.text_so_far, self.start = "", time.perf_counter()
        self.tokens, self.first = 0, 0.0


class Silent:
    def info(self, line: str) -> None:
        pass


class Report:
    """The `output` that packing writes its summary line to."""

    def __init__(self, post: Callable[[Any], None]) -> None:
        self.post = post

    def info(self, line: str) -> None:
        self.post(LogMessage(line))
