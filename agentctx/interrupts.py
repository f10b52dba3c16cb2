"""SIGTERM and SIGHUP handled as Ctrl-C is: the turn streaming is stopped, and kept.

A signal raises Interrupted (a KeyboardInterrupt, so every `except KeyboardInterrupt`
that keeps a partial answer keeps it for these too); the process then exits 128 + the
signal's number, as a shell reports a process the signal ended (130 for SIGINT).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(e: KeyboardInterrupt) -> int:
    return 128 + getattr(e, "signum", signal.SIGINT)


def note(e: KeyboardInterrupt, text: str) -> None:
    """Say what was kept (and what was not) when the interrupt is reported."""
    e.note = text  # type: ignore[attr-defined]


def message(e: KeyboardInterrupt) -> str:
    text = getattr(e, "note", None)
    return f"interrupted: {text}" if text else "interrupted"


@contextlib.contextmanager
def terminating_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP raise Interrupted. The first one restores the default
    handlers, so a second signal ends the process at once if the cleanup hangs (what had
    streamed is stored already: agentctx.turn_record)."""

    def handler(signum, frame) -> None:
        for sig in TERMINATING:
            signal.signal(sig, signal.SIG_DFL)
        raise Interrupted(signum)

    # (a signal ignored on purpose stays ignored: `nohup agentctx ask ...`)
    mine = [sig for sig in TERMINATING if signal.getsignal(sig) is not signal.SIG_IGN]
    before = {sig: signal.signal(sig, handler) for sig in mine}
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)
