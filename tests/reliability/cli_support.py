"""Helpers for the reliability matrix's CLI tests: `python -m agentctx` as a real
subprocess (signals at their defaults), its stderr in a file, and a child that file
permissions bind even when the tests run as root."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sessions.store import SessionStore

AGENTCTX = [sys.executable, "-m", "agentctx"]
LONG = ("Write a long story about a friendly greeter who travels the world, one country "
        "per paragraph.")  # fmt: skip


def _default_signals() -> None:
    # a suite started in the background of a non-interactive shell inherits SIGINT (and a
    # nohup one SIGHUP) ignored, and Python leaves them ignored
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def start(args: list[str], stderr: Path, preexec=None) -> subprocess.Popen:
    """`agentctx ARGS`, stdout a pipe, stderr into the file."""

    def setup() -> None:
        _default_signals()
        if preexec is not None:
            preexec()

    with open(stderr, "w") as err:
        return subprocess.Popen(
            [*AGENTCTX, *args], stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=setup
        )


def wait_for_answer(proc: subprocess.Popen, chars: int = 8) -> str:
    """The first characters of the answer on stdout (the model is streaming then)."""
    first = proc.stdout.read(chars)
    assert first, "the answer never started"
    return first


def last_answer(home: Path):
    """(session, its messages) of the most recent session."""
    store = SessionStore(home / "sessions.db")
    try:
        session = store.latest()
        assert session is not None, "no session was stored"
        return session, store.messages(session.id)
    finally:
        store.close()


def wait_until(predicate, timeout: float = 120.0, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)


_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def file_permissions_bind():
    """A preexec_fn after which the child's file permissions are checked as any user's:
    for root, CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH leave its capability bounding set
    (so a 0444 file is read-only to it); None when not root. Raises OSError where the
    caller may not drop them."""
    if os.geteuid() != 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def drop() -> None:
        for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    return drop
