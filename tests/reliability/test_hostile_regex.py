"""Catastrophic regexes end within a bound with `error: pattern too slow`; regexes that
break Python's parser become one-line errors; linear patterns over large text still work."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.regex_guard import MAX_PATTERN_CHARS

from .support import CPU_BOUND_S, UNFORESEEN, WALL_BOUND_S, timed_tool

REPO = Path(__file__).resolve().parents[2]
CATASTROPHIC = [r"(\w+\s?)*$", r"(a+)+$", r"(a|aa)+$", r"(a*)*b", r"(.*a){25}"]
# Each pattern backtracks exponentially (or as n**25) on one of these lines.
HOSTILE_LINES = ["a" * 40 + "!", "word " * 40 + "!", "a" * 60]


@pytest.fixture
def hostile_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "lines.txt").write_text("\n".join(HOSTILE_LINES) + "\n")
    (root / "ok.py").write_text("def ok():\n    return 'aaa'\n")
    return root


@pytest.fixture
def hostile_book(tmp_path: Path) -> Path:
    path = tmp_path / "book.txt"
    path.write_text("CHAPTER I\n\n" + "\n".join(HOSTILE_LINES) + "\nThe end.\n")
    return path


def assert_too_slow(result: str, cpu: float, wall: float) -> None:
    assert result.startswith("error: pattern too slow"), result[:200]
    assert "\n" not in result
    assert_bounded(result, cpu, wall)


def assert_bounded(result: str, cpu: float, wall: float) -> None:
    assert not result.startswith(UNFORESEEN), result[:200]
    assert cpu < CPU_BOUND_S, f"{cpu:.2f} s of CPU"
    assert wall < WALL_BOUND_S, f"{wall:.2f} s of wall time"


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_grep_ends_a_catastrophic_pattern_in_time(hostile_repo: Path, pattern: str) -> None:
    # `regex` finds most of these in linear time (a true answer); the others run out of
    # budget; Python's re ran each for hours
    result, cpu, wall = timed_tool(hostile_repo, "grep", {"pattern": pattern})
    assert_bounded(result, cpu, wall)
    assert result.startswith(("lines.txt:", "ok.py:", "no matches", "error: pattern too slow"))


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_search_book_ends_a_catastrophic_pattern_in_time(hostile_book: Path, pattern: str) -> None:
    result, cpu, wall = timed_tool(hostile_book, "search_book", {"query": pattern, "regex": True})
    assert_bounded(result, cpu, wall)
    assert result.startswith(("chapter 1, line", "no matches", "error: pattern too slow"))


@pytest.mark.parametrize("tool", ["grep", "search_book"])
def test_a_pattern_that_backtracks_without_end_is_too_slow(
    hostile_repo: Path, hostile_book: Path, tool: str
) -> None:
    # (a|aa)+$ on forty a's and a '!': every split of the a's is tried, in `regex` too
    if tool == "grep":
        assert_too_slow(*timed_tool(hostile_repo, "grep", {"pattern": r"(a|aa)+$"}))
    else:
        arguments = {"query": r"(a|aa)+$", "regex": True}
        assert_too_slow(*timed_tool(hostile_book, "search_book", arguments))


def test_grep_over_this_repository_stops_a_polynomial_pattern() -> None:
    # no single line is slow here: the time adds up over the repository's lines
    result, cpu, wall = timed_tool(REPO, "grep", {"pattern": r"(\w+\s?)*$"})
    assert not result.startswith(UNFORESEEN)
    # it either finishes or stops; either way within the bound (re took minutes)
    assert cpu < CPU_BOUND_S + 1.5 and wall < 3 * WALL_BOUND_S, (cpu, wall)


def test_grep_over_this_repository_with_a_linear_pattern_is_not_cut_short() -> None:
    result, _, _ = timed_tool(REPO, "grep", {"pattern": r"\bdef \w+\(", "max_matches": 5})
    lines = result.splitlines()
    assert not result.startswith("error") and lines[5].endswith(" more matches"), result


def test_a_catastrophic_path_glob_is_stopped(hostile_repo: Path) -> None:
    (hostile_repo / ("a" * 200 + ".py")).write_text("x = 1\n")
    result, cpu, wall = timed_tool(
        hostile_repo, "grep", {"pattern": "x", "path_glob": "*" * 200 + "z"}
    )
    assert_bounded(result, cpu, wall)
    assert result.startswith(("no matches", "error: pattern too slow")), result


def test_a_linear_pattern_over_a_large_book_is_not_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    line = "Call me Ishmael, some years ago, never mind how long precisely, the whale. "
    path.write_text("CHAPTER I\n\n" + (line * 2 + "\n") * 40_000)  # 6 MB
    arguments = {"query": r"wh\w+e\b", "regex": True, "max_matches": 1}
    result, _, _ = timed_tool(path, "search_book", arguments)
    assert result.startswith("chapter 1, line 3: Call me Ishmael"), result[:200]
    assert result.endswith("... 39999 more matches")


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("(" * 2000 + "a" + ")" * 2000, "error: pattern too long: 4,001 characters"),
        ("(" * 450 + "a" + ")" * 450, "groups nest too deeply"),
        ("a{99999999999}", "error: invalid regex 'a{99999999999}': OverflowError"),
        ("((a{1000}){1000}){1000}", "error: pattern too complex"),
        ("(x{1000}){1000}", "error: pattern too complex"),
        ("x" * 5_000_000, f"limit {MAX_PATTERN_CHARS:,}"),
        ("[z-a]", "error: invalid regex '[z-a]': bad character range"),
    ],
    ids=["nested-2000", "nested-450", "huge-repeat", "unrolls-1e9", "unrolls-1e6", "5MB",
         "range"],
)  # fmt: skip
@pytest.mark.parametrize("tool", ["grep", "search_book"])
def test_a_regex_that_breaks_the_parser_is_one_line(
    hostile_repo: Path, hostile_book: Path, tool: str, pattern: str, message: str
) -> None:
    root, arguments = (
        (hostile_repo, {"pattern": pattern})
        if tool == "grep"
        else (hostile_book, {"query": pattern, "regex": True})
    )
    result, _, wall = timed_tool(root, tool, arguments)
    assert message in result and result.startswith("error: ")
    assert "\n" not in result and len(result) < 400
    assert wall < WALL_BOUND_S


def test_a_pattern_that_is_fine_still_finds(hostile_repo: Path) -> None:
    result, _, _ = timed_tool(
        hostile_repo, "grep", {"pattern": r"def (\w+)\(", "path_glob": "*.py"}
    )
    assert result == "ok.py:1: def ok():"
