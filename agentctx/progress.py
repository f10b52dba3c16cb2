"""Progress lines on stderr: the prefill bar, then decode speed, then a summary."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, stream=None, width: int = 24):
        self.out = stream or sys.stderr
        self.width = width
        self.tty = self.out.isatty()
        self.start = time.perf_counter()
        self.last = 0.0
        self.shown = False

    def prefill(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if self.tty and now - self.last < 0.1 and done < total:
            return
        self.last = now
        frac = done / total if total else 1.0
        filled = int(frac * self.width)
        rate = done / (now - self.start) if now > self.start else 0.0
        bar = "#" * filled + "." * (self.width - filled)
        line = f"prefill [{bar}] {frac:4.0%} {done}/{total} tokens {rate:,.0f} tok/s"
        if self.tty:
            self.out.write("\r" + line)
        elif done >= total or not self.shown:
            self.out.write(line + "\n")
        self.shown = True
        self.out.flush()

    def end_prefill(self) -> None:
        if self.tty and self.shown:
            self.out.write("\n")
            self.out.flush()

    def line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()
