"""Helpers for the reliability matrix: timed tool calls and real git repositories."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from tools.registry import run_tool

# Matching stops after about 0.5 s of CPU time (tools/regex_guard.py); a machine shared by
# many jobs stretches that in wall time, so the wall bound is looser than the CPU bound.
CPU_BOUND_S = 2.0
WALL_BOUND_S = 10.0
# What the registry answers for an exception no tool turned into a message of its own.
UNFORESEEN = "error: internal error"


def timed_tool(root: Path, name: str, arguments: Any) -> tuple[str, float, float]:
    """(result, CPU seconds of this thread, wall seconds) of one tool call."""
    wall, cpu = time.monotonic(), time.thread_time()
    result = run_tool(root, name, arguments)
    return result, time.thread_time() - cpu, time.monotonic() - wall


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True
    ).stdout


def make_repo(root: Path, files: dict[str, str]) -> Path:
    """A real repository at root with files committed in one commit (a fixed date)."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(root, "add", "-A")
    commit_all(root, "First")
    return root


def commit_all(root: Path, message: str) -> None:
    git(root, "add", "-A")
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=Ada", "-c", "user.email=ada@example.com",
         "commit", "-qm", message],
        check=True,
        capture_output=True,
        env={"GIT_AUTHOR_DATE": "1709294400 +0000", "GIT_COMMITTER_DATE": "1709294400 +0000",
             "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(root)},
    )  # fmt: skip
