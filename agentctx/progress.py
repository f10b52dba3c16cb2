"""Progress lines on stderr: the prefill bar, then decode speed, then a summary.

On a terminal the prefill bar is redrawn in place, at most every 0.1 s. Anywhere else (a
pipe, a log file, CI) it is written as whole lines: one when the prefill's first chunk is
done, then one whenever `interval` seconds or a tenth of the prompt have passed since the
last, whichever comes first, and one at the end. A 32K prefill on a slow machine then says
how far it is every few seconds (or every chunk, when a chunk takes longer), and a fast
one writes about a dozen lines, not one per chunk.
"""

from __future__ import annotations

import sys
import time

REDRAW_S = 0.1  # a terminal's bar is redrawn at most this often


def duration(seconds: float) -> str:
    """45s, 3m06s, 1h02m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    def __init__(self, stream=None, width: int = 24, interval: float = 5.0, step: float = 0.1,
                 clock=time.monotonic):  # fmt: skip
        """interval, step: away from a terminal, a line at least every `interval` seconds
        (as chunks finish) or every `step` of the prompt. clock: seconds, for tests."""
        self.out = stream or sys.stderr
        self.width, self.interval, self.step, self.clock = width, interval, step, clock
        self.tty = self.out.isatty()
        self.total = self.done = -1  # the prefill in progress; -1: none yet
        self.t0 = self.done0 = 0.0  # its first event: when, and how many tokens were done
        self.last_t = self.last_done = None  # the last line or redraw written
        self.bar_open = False  # a terminal's bar awaits its newline

    def prefill(self, done: int, total: int) -> None:
        """A prefill event: `done` of the prompt's `total` tokens are in the cache."""
        now = self.clock()
        if total != self.total or done < self.done or self.done >= self.total:
            self._start(now, done, total)  # the next turn, or an agent's next step
        self.done = done
        if not self._due(now, done, total):
            return
        self.last_t, self.last_done = now, done
        line = self._line(now, done, total)
        self.out.write("\r" + line if self.tty else line + "\n")
        self.out.flush()
        self.bar_open = self.tty

    def _start(self, now: float, done: int, total: int) -> None:
        """A new prefill: its rate and lines start over."""
        self.total, self.t0, self.done0 = total, now, done
        self.last_t = self.last_done = None

    def _due(self, now: float, done: int, total: int) -> bool:
        if self.last_t is None or done >= total:
            return True
        if self.tty:
            return now - self.last_t >= REDRAW_S
        return now - self.last_t >= self.interval or done - self.last_done >= self.step * total

    def _line(self, now: float, done: int, total: int) -> str:
        frac = done / total if total else 1.0
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        line = f"prefill [{bar}] {frac:4.0%} {done:,}/{total:,} tokens"
        elapsed = now - self.t0
        if elapsed <= 0 or done <= self.done0:
            return line  # (the first event: no rate yet)
        rate = (done - self.done0) / elapsed
        line += f", {rate:,.0f} tok/s"
        if done >= total:
            return line + f", {duration(elapsed)}"
        return line + f", ETA {duration((total - done) / rate)}"

    def end_prefill(self) -> None:
        if self.bar_open:
            self.out.write("\n")
            self.out.flush()
            self.bar_open = False

    def line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()
