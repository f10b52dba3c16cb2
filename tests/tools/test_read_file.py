from __future__ import annotations

from pathlib import Path

import pytest

from tools.errors import (
    BinaryFileError,
    FileTooLargeError,
    PathEscapeError,
    RootError,
    ToolError,
    UnreadableFileError,
)
from tools.read_file import read_file

from .support import hostile_files, write

TEN = "".join(f"line {n}\n" for n in range(1, 11))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write(root, "ten.txt", TEN)
    hostile_files(root, tmp_path / "outside")
    return root


def test_reads_the_whole_file_with_a_header_and_numbers(root: Path) -> None:
    out = read_file(root, "ten.txt")
    lines = out.splitlines()
    assert lines[0] == "ten.txt (lines 1-10 of 10)"
    assert lines[1] == "   1| line 1"
    assert lines[-1] == "  10| line 10"


def test_reads_a_range_and_clamps_end_to_the_file(root: Path) -> None:
    assert read_file(root, "ten.txt", start=3, end=4).splitlines() == [
        "ten.txt (lines 3-4 of 10)",
        "   3| line 3",
        "   4| line 4",
    ]
    assert read_file(root, "ten.txt", start=9, end=500).splitlines()[0] == (
        "ten.txt (lines 9-10 of 10)"
    )


def test_notes_truncation_and_where_to_read_on(root: Path) -> None:
    out = read_file(root, "ten.txt", start=2, max_lines=3)
    assert out.splitlines()[0] == "ten.txt (lines 2-4 of 10)"
    assert out.splitlines()[-1] == "... truncated at 3 lines; read on with start=5"


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (0, None, "start must be 1 or more"),
        (11, None, r"start line 11 is past the end of ten.txt \(10 lines\)"),
        (5, 4, r"end \(4\) is before start \(5\)"),
    ],
)
def test_bad_ranges_are_one_line_errors(
    root: Path, start: int, end: int | None, message: str
) -> None:
    with pytest.raises(ToolError, match=message) as info:
        read_file(root, "ten.txt", start=start, end=end)
    assert "\n" not in str(info.value)


def test_crlf_and_empty_files(root: Path) -> None:
    write(root, "dos.txt", b"one\r\ntwo\r\n")
    write(root, "empty.txt", "")
    assert read_file(root, "dos.txt").splitlines()[1:] == ["   1| one", "   2| two"]
    assert read_file(root, "empty.txt") == "empty.txt (empty file)"


def test_clips_very_long_lines(root: Path) -> None:
    write(root, "min.js", "a" * 5000 + "\n")
    line = read_file(root, "min.js").splitlines()[1]
    assert line.endswith("… [+4000 chars]")
    assert len(line) < 1100


def test_refuses_escapes(root: Path, tmp_path: Path) -> None:
    with pytest.raises(PathEscapeError):
        read_file(root, "../outside/secret.py")
    with pytest.raises(PathEscapeError):
        read_file(root, str(tmp_path / "outside" / "secret.py"))
    with pytest.raises(PathEscapeError):
        read_file(root, "leak.py")


def test_refuses_binary_invalid_utf8_huge_and_missing_files(root: Path) -> None:
    with pytest.raises(BinaryFileError, match="not a text file: blob.py"):
        read_file(root, "blob.py")
    with pytest.raises(BinaryFileError, match="latin.py"):
        read_file(root, "latin.py")
    with pytest.raises(FileTooLargeError, match="file too large: huge.py"):
        read_file(root, "huge.py")
    with pytest.raises(UnreadableFileError):
        read_file(root, "nope.txt")


def test_refuses_a_missing_root(tmp_path: Path) -> None:
    with pytest.raises(RootError):
        read_file(tmp_path / "nope", "a.txt")
