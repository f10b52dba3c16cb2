"""The chat screen's side of a running turn: what the turn's worker reports (the messages of
turn_messages.py) goes to the log and the header."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentctx.tui.turn_messages import (
        AnswerUpdate,
        LogMessage,
        PhaseUpdate,
        PrefillUpdate,
        ToolCalled,
        TurnFinished,
    )


class TurnView:
    """Mixed into ChatScreen (which has `meter`, `status`, `log_view` and `app`): the
    handlers of the turn's messages, found by their names (on_log_message for LogMessage,
    ...)."""

    def on_log_message(self, event: LogMessage) -> None:
        if event.kind == "check":  # (agentctx.answer_check) the next text is a new answer
            self.log_view.end_answer("complete")
        self.log_view.add_line(event.text, event.kind, event.markdown)

    def on_prefill_update(self, event: PrefillUpdate) -> None:
        self.meter.set_prefill(event.done, event.total, self.app.window)
        if event.done < event.total:
            done, total = f"{event.done:,}", f"{event.total:,}"
            self.status.set_phase(f"prefill {done}/{total} · {event.tok_s:,.0f} tok/s")
        else:
            self.status.set_phase("decoding")

    def on_phase_update(self, event: PhaseUpdate) -> None:
        self.status.set_phase(event.phase)

    def on_answer_update(self, event: AnswerUpdate) -> None:
        self.log_view.stream_answer(event.text)
        if event.tokens:
            self.status.set_decode(event.tokens, event.tok_s)
            self.meter.set_streamed(event.tokens)

    def on_tool_called(self, event: ToolCalled) -> None:
        self.log_view.add_tool_call(event.label, event.output, event.error)

    def on_turn_finished(self, event: TurnFinished) -> None:
        from agentctx.output import usage_summary

        self.log_view.end_answer(event.status)
        self.status.stop()
        if event.usage is None:  # it failed: the meter keeps the last good figure
            self.meter.keep_last_good()
            return
        self.meter.set_usage(event.usage, event.window)
        if "ttft_s" in event.usage:  # the line ask prints after an answer
            self.log_view.add_line(usage_summary(event.usage), "summary")
