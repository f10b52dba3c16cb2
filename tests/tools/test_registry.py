from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tools.registry import BOOK_TOOLS, REPO_TOOLS, TOOLS, run_tool, schemas

from .support import commit, hostile_files, init_repo, write


@pytest.fixture
def repo_root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    with init_repo(root) as repo:
        write(root, "app.py", "def main():\n    return 1\n")
        commit(repo, "Add app", "app.py")
    hostile_files(root, tmp_path / "outside")
    return root


def test_every_tool_is_described_for_the_model() -> None:
    assert REPO_TOOLS == (
        "list_files",
        "read_file",
        "grep",
        "git_log",
        "git_show",
        "git_diff",
        "git_blame",
        "outline",
    )
    assert BOOK_TOOLS == ("chapters", "read_chapter", "read_lines", "search_book")
    for spec in TOOLS.values():
        assert spec.description
        assert spec.parameters["type"] == "object"
        assert set(spec.parameters["required"]) <= set(spec.parameters["properties"])
    # the schemas are plain JSON, ready for a chat template
    assert json.loads(json.dumps(schemas(BOOK_TOOLS)))[0]["function"]["name"] == "chapters"


def test_runs_each_repo_tool(repo_root: Path) -> None:
    assert run_tool(repo_root, "list_files", {}).splitlines()[0] == "4 files"
    assert run_tool(repo_root, "read_file", {"path": "app.py", "end": 1}).endswith("1| def main():")
    assert (
        run_tool(repo_root, "grep", {"pattern": "main"})
        == "app.py:1: def main():\n(3 binary, too large or unreadable files skipped)"
    )
    assert run_tool(repo_root, "git_log", {}).endswith("Ada Lovelace: Add app")
    assert "Add app" in run_tool(repo_root, "git_show", {"rev": "HEAD"})
    assert "untracked files: blob.py" in run_tool(repo_root, "git_diff", {})
    assert "Ada Lovelace" in run_tool(repo_root, "git_blame", {"path": "app.py"})
    assert run_tool(repo_root, "outline", {"path": "app.py"}).endswith("1-2  def main()")


def test_runs_each_book_tool(tmp_path: Path) -> None:
    book = write(tmp_path, "book.txt", "Chapter 1\n\nCall me Ishmael.\n\nChapter 2\n\nThe end.\n")
    assert run_tool(book, "chapters", {}).startswith("book.txt: 2 chapters")
    assert run_tool(book, "read_chapter", {"index": 2}).endswith("7| The end.")
    assert run_tool(book, "read_lines", {"start": 3, "end": 3}).endswith("3| Call me Ishmael.")
    assert (
        run_tool(book, "search_book", {"query": "ishmael"}) == "chapter 1, line 3: Call me Ishmael."
    )


def test_an_unknown_tool(repo_root: Path) -> None:
    assert run_tool(repo_root, "rm_rf", {}).startswith(
        "error: unknown tool 'rm_rf'; tools: list_files"
    )


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("read_file", {"path": 3}, "error: argument 'path' of read_file must be a string, got 3"),
        ("read_file", {"path": "app.py", "start": "2"}, "must be an integer, got '2'"),
        ("read_file", {"path": "app.py", "start": True}, "must be an integer, got True"),
        (
            "read_file",
            {"path": "app.py", "start": 0},
            "argument 'start' of read_file must be 1 or more",
        ),
        ("grep", {"pattern": "x", "ignore_case": "yes"}, "must be a boolean"),
        ("read_file", {}, "error: read_file needs argument 'path'"),
        (
            "read_file",
            {"path": "app.py", "lines": 3},
            "error: unknown argument 'lines' for read_file; expected: path, start, end, max_lines",
        ),
        ("read_file", ["app.py"], "error: read_file takes an object of named arguments"),
    ],
)
def test_bad_arguments_come_back_as_errors(
    repo_root: Path, name: str, arguments, message: str
) -> None:
    out = run_tool(repo_root, name, arguments)
    assert out.startswith("error: ")
    assert message in out


def test_null_optional_arguments_are_left_out(repo_root: Path) -> None:
    out = run_tool(repo_root, "read_file", {"path": "app.py", "end": None})
    assert out.startswith("app.py (lines 1-2 of 2)")


def test_tool_errors_come_back_as_one_line_strings(repo_root: Path, tmp_path: Path) -> None:
    cases = {
        ("read_file", "../outside/secret.py"): "error: path is outside the repository",
        ("read_file", str(tmp_path / "outside" / "secret.py")): "error: path is outside",
        ("read_file", "leak.py"): "error: path is outside",
        ("read_file", "blob.py"): "error: not a text file: blob.py",
        ("outline", "latin.py"): "error: not a text file: latin.py",
        ("git_blame", "huge.py"): "error: file too large: huge.py",
        ("read_file", "missing.py"): "error: cannot read missing.py",
    }
    for (name, path), message in cases.items():
        out = run_tool(repo_root, name, {"path": path})
        assert out.startswith(message), out
        assert "\n" not in out
    assert run_tool(repo_root, "grep", {"pattern": "("}).startswith("error: invalid regex")


def test_repository_errors_come_back_as_strings(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    write(plain, "a.py")
    assert run_tool(plain, "git_log", {}) == f"error: not a git repository: {plain}"
    empty = tmp_path / "empty"
    init_repo(empty).close()
    assert run_tool(empty, "git_show", {}) == "error: the repository has no commits yet"
    assert run_tool(tmp_path / "nope", "list_files", {}).startswith(
        "error: repository path does not exist"
    )
    book_dir = run_tool(tmp_path, "chapters", {})
    assert book_dir.startswith("error: a book is one text file, not a directory")


def test_os_errors_come_back_as_strings(repo_root: Path) -> None:
    # the file system itself refuses this name: an OSError no tool turned into a ToolError
    out = run_tool(repo_root, "read_file", {"path": "a" * 300})
    assert out.startswith("error: File name too long: ")
    assert "\n" not in out


def test_a_name_that_is_not_utf8_goes_to_the_model_printable_and_back(repo_root: Path) -> None:
    write(repo_root, os.fsdecode(b"caf\xe9.py"), "def cafe():\n    return 1\n")
    calls = {
        "list_files": {},
        "read_file": {"path": "caf\\xe9.py"},
        "grep": {"pattern": "cafe"},
        "outline": {"path": "caf\\xe9.py"},
        "git_diff": {},
        # git's own complaint names the file: it is not in HEAD
        "git_show": {"path": "caf\\xe9.py"},
    }

    out = {name: run_tool(repo_root, name, arguments) for name, arguments in calls.items()}

    assert "caf\\xe9.py" in out["list_files"].splitlines()
    assert out["read_file"].startswith("caf\\xe9.py (lines 1-2 of 2)\n   1| def cafe():")
    assert out["grep"].startswith("caf\\xe9.py:1: def cafe():")
    assert out["outline"].endswith("1-2  def cafe()")
    assert "untracked files: blob.py, caf\\xe9.py" in out["git_diff"]
    assert out["git_show"] == "error: path 'caf\\xe9.py' exists on disk, but not in 'HEAD'"
    for text in out.values():
        text.encode("utf-8")  # no surrogate left for a tokenizer to choke on
