"""The chat screen's side of a running turn: what the turn's worker reports (the messages of
turn_messages.py) goes to the log and the header."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentctx.tui.turn_messages import (
        AnswerUpdate,
        LogMessage,
        PrefillUpdate,
        ToolCalled,
        TurnFinished,
    )


class TurnView:
    """Mixed into ChatScreen (which has `meter`, `log_view` and `app`): the handlers of the
    turn's messages, found by their names (on_log_message for LogMessage, ...)."""

    def on_log_message(self, event: LogMessage) -> None:
        self.log_view.add_line(event.text, event.kind, event.markdown)

    def on_prefill_update(self, event: PrefillUpdate) -> None:
        self.meter.set_prefill(event.done, event.total, event.tok_s, self.app.window)

    def on_answer_update(self, event: AnswerUpdate) -> None:
        self.log_view.stream_answer(event.text)

    def on_tool_called(self, event: ToolCalled) -> None:
        self.log_view.add_tool_call(event.label, event.output, event.error)

    def on_turn_finished(self, event: TurnFinished) -> None:
        self.log_view.end_answer(event.status)
        if event.usage is not None:
            self.meter.set_usage(event.usage, event.window)
        else:
            self.meter.set_prefill(1, 1, 0.0)  # clear the progress
