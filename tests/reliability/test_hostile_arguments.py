"""Every registered tool, pushed through hostile arguments, answers a string within a time
bound: its own `error: ...` line or a result, never an exception or an unforeseen error."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tools.registry import TOOLS, ToolSpec, _params, run_tool

from .support import UNFORESEEN, commit_all, make_repo

HUGE = 10**30
STRINGS = [
    "", " ", "\0", "a\0b", "x" * 100_000, "\n", "../../../etc/passwd", "/etc/passwd",
    "~/.ssh/id_rsa", "~root", "link-out", "link-loop", "fifo", "pkg", "..", ".", "/",
    "\udcff", "\ud800", "caf\xe9", "-n", "--output=/tmp/pwned", "--", "HEAD:../outside.txt",
    "HEAD^{tree}", ":/", "@{-1}", "HEAD~99999999999999999999", "*" * 300 + "z",
    "(a|aa)+$", "[", "%s%n", "\\", "\\x00", "a" * 5000 + ".py", "app.py\nmain.py",
]  # fmt: skip
INTEGERS = [0, -1, -HUGE, HUGE, 2**63, 2**31, 1]
WRONG = [None, True, 1.5, float("nan"), float("inf"), [], {}, ["app.py"], {"a": 1}, "7"]
BOUND_S = 20.0  # git and file reads on a machine shared by many jobs


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hostile")
    outside = base / "outside.txt"
    outside.write_text("OUTSIDE-CONTENT\n")
    repo = make_repo(
        base / "repo", {"app.py": "def main():\n    return 1\n", "pkg/m.py": "x = 1\n"}
    )
    os.symlink(outside, repo / "link-out")
    os.symlink(repo / "link-loop", repo / "link-loop")
    os.mkfifo(repo / "fifo")
    (repo / "app.py").write_text("def main():\n    return 2\n")
    commit_all(repo, "Second")
    book = base / "book.txt"
    book.write_text("CHAPTER I\n\nIt was a dark night.\n\nCHAPTER II\n\nMorning came.\n")
    return {"repo": repo, "book": book}


def call(root: Path, name: str, arguments) -> str:
    start = time.monotonic()
    result = run_tool(root, name, arguments)
    elapsed = time.monotonic() - start
    assert isinstance(result, str), (name, arguments)
    assert elapsed < BOUND_S, (name, arguments, elapsed)
    assert not result.startswith(UNFORESEEN), (name, str(arguments)[:200], result[:300])
    assert "OUTSIDE-CONTENT" not in result and "Traceback" not in result
    return result


def hostile_arguments(name: str) -> list:
    spec = TOOLS[name]
    properties = spec.parameters["properties"]
    required = {key: _fine(key, properties[key]["type"]) for key in spec.parameters["required"]}
    cases: list = [None, [], "app.py", 7, {"nope": 1}, {**required, "extra": 1}]
    for key, schema in properties.items():
        values = WRONG + (STRINGS if schema["type"] == "string" else INTEGERS)
        cases += [{**required, key: value} for value in values]
    return cases


def _fine(key: str, kind: str):
    return {"string": "app.py", "integer": 1, "boolean": False}[kind] if key != "query" else "night"


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_every_tool_survives_hostile_arguments(roots: dict[str, Path], name: str) -> None:
    root = roots[TOOLS[name].kind]
    for arguments in hostile_arguments(name):
        call(root, name, arguments)


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_every_tool_survives_a_hostile_root(tmp_path: Path, name: str) -> None:
    required = {k: _fine(k, TOOLS[name].parameters["properties"][k]["type"])
                for k in TOOLS[name].parameters["required"]}  # fmt: skip
    os.mkfifo(tmp_path / "fifo")
    for root in [tmp_path / "missing", tmp_path / "fifo", Path("/proc/self"),
                 Path("\0"), Path("x" * 5000)]:  # fmt: skip
        result = call(root, name, required)
        assert result.startswith("error: ") or name == "list_files", (root, result[:200])


def test_an_unforeseen_exception_becomes_one_line(monkeypatch, roots: dict[str, Path]) -> None:
    def broken(root, depth: int = 1) -> str:
        raise RecursionError("maximum recursion depth exceeded")

    spec = ToolSpec("broken", "a tool with a bug", _params(depth=("integer", "d")), broken, "repo")
    monkeypatch.setitem(TOOLS, "broken", spec)
    assert run_tool(roots["repo"], "broken", {}) == (
        "error: internal error in broken: RecursionError: maximum recursion depth exceeded"
    )
