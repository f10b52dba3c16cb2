"""A turn's rows written while it runs in the TUI: the turn's worker thread streams, the
store belongs to the main thread, so every write crosses to it (Textual's call_from_thread)."""

from __future__ import annotations

import contextlib
import time

from agentctx.turn_record import FLUSH_S


class MainThreadRecord:
    """An agentctx.turn_record.TurnRecord driven from the worker thread: the streamed text is
    read here at most every FLUSH_S and written on the main thread; a tool step is stored
    when it ends. `call(fn, *args)` runs fn on the main thread (None once the app is gone)."""

    def __init__(self, record, call) -> None:
        self.record, self.call = record, call
        self._last = 0.0

    def stream(self, text_so_far) -> None:
        now = time.monotonic()
        if now - self._last < FLUSH_S:
            return
        self._last, text = now, text_so_far()
        self.call(self.record.stream, lambda: text)

    def step(self, step) -> None:
        from sessions.errors import StoreError

        # (a store locked past its busy timeout loses the step's rows, not the turn)
        with contextlib.suppress(StoreError):
            self.call(self.record.step, step)


def start_record(store, turn):
    """Store the turn's question (main thread) before it runs: its TurnRecord, or None when
    the store refuses it now (then the whole turn is stored when it ends)."""
    from agentctx.tui.errors import user_errors
    from agentctx.turn_record import TurnRecord

    try:
        return TurnRecord.start(store, turn)
    except user_errors():
        return None


def fail_record(record) -> None:
    """The turn failed: what it stored goes (or, once answered, stays marked error)."""
    from agentctx.tui.errors import user_errors

    with contextlib.suppress(*user_errors()):
        record.fail_unanswered()
