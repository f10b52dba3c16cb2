from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.book import Chapter, chapters, list_chapters, read_chapter, read_lines, search_book
from tools.errors import BinaryFileError, FileTooLargeError, ToolError, UnreadableFileError

BOOKS = Path(__file__).resolve().parents[3] / "shared" / "data" / "books"

NOVEL = """\
THE TALE
by Someone

CHAPTER I. The Start

It was a dark night. The ship sailed.
Chapter I think was the best.

CHAPTER II

Morning came; the WHALE rose.

CHAPTER XLII. The Pequod

The Pequod sailed on.
The end.
"""


def book(tmp_path: Path, text: str | bytes, name: str = "book.txt") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_chapter_headings_with_roman_numerals_and_front_matter(tmp_path: Path) -> None:
    assert chapters(book(tmp_path, NOVEL)) == [
        Chapter(0, "(front matter)", 1, 3, 4),
        Chapter(1, "CHAPTER I. The Start", 4, 8, 18),
        Chapter(2, "CHAPTER II", 9, 12, 7),
        Chapter(3, "CHAPTER XLII. The Pequod", 13, 16, 10),
    ]


def test_arabic_chapters_and_a_contents_table(tmp_path: Path) -> None:
    text = "Contents\n\nChapter 1.\nChapter 2.\n\nChapter 1.\n\nOne.\n\nChapter 2.\n\nTwo.\n"
    found = chapters(book(tmp_path, text))
    assert [(c.index, c.title, c.start_line) for c in found] == [
        (0, "(front matter)", 1),
        (1, "Chapter 1.", 6),
        (2, "Chapter 2.", 10),
    ]


def test_markdown_headings_outside_code_fences(tmp_path: Path) -> None:
    text = "# Part One\n\nText.\n\n```\n# not a heading\n```\n\n## Section **two**\n\nMore.\n"
    found = chapters(book(tmp_path, text, "book.md"))
    assert [(c.title, c.start_line, c.end_line) for c in found] == [
        ("Part One", 1, 8),
        ("Section **two**", 9, 11),
    ]


def test_falls_back_to_fixed_parts(tmp_path: Path) -> None:
    found = chapters(book(tmp_path, "word\n" * 1200))
    assert [(c.title, c.start_line, c.end_line, c.words) for c in found] == [
        ("part 1", 1, 500, 500),
        ("part 2", 501, 1000, 500),
        ("part 3", 1001, 1200, 200),
    ]


def test_list_chapters_text(tmp_path: Path) -> None:
    out = list_chapters(book(tmp_path, NOVEL)).splitlines()
    assert out[0] == "book.txt: 4 chapters, 39 words"
    assert out[2] == "  1. CHAPTER I. The Start (lines 4-8, 18 words)"


def test_read_chapter(tmp_path: Path) -> None:
    path = book(tmp_path, NOVEL)
    assert read_chapter(path, 2).splitlines() == [
        "chapter 2: CHAPTER II (lines 9-12 of 16)",
        "   9| CHAPTER II",
        "  10| ",
        "  11| Morning came; the WHALE rose.",
        "  12| ",
    ]
    assert read_chapter(path, 1, max_lines=2).splitlines()[-1] == (
        "... truncated at 2 lines; read on with start=6"
    )
    with pytest.raises(ToolError, match="no chapter 9: chapters run from 0 to 3"):
        read_chapter(path, 9)


def test_read_lines(tmp_path: Path) -> None:
    path = book(tmp_path, NOVEL)
    assert read_lines(path, 15, 99).splitlines() == [
        "book.txt (lines 15-16 of 16)",
        "  15| The Pequod sailed on.",
        "  16| The end.",
    ]
    with pytest.raises(ToolError, match="past the end"):
        read_lines(path, 17)


def test_search_book_substring_and_regex(tmp_path: Path) -> None:
    path = book(tmp_path, NOVEL)
    assert search_book(path, "whale").splitlines() == [
        "chapter 2, line 11: Morning came; the WHALE rose."
    ]
    # a substring search takes regex characters literally
    assert search_book(path, "rose.") == "chapter 2, line 11: Morning came; the WHALE rose."
    assert search_book(path, "r.se") == "no matches for 'r.se'"
    assert search_book(path, "r.se", regex=True).startswith("chapter 2, line 11")
    assert search_book(path, "pequod", max_matches=1).splitlines() == [
        "chapter 3, line 13: CHAPTER XLII. The Pequod",
        "... 1 more matches",
    ]
    with pytest.raises(ToolError, match="invalid regex"):
        search_book(path, "(", regex=True)


def test_validates_the_book_path(tmp_path: Path) -> None:
    with pytest.raises(UnreadableFileError, match="book not found"):
        chapters(tmp_path / "missing.txt")
    with pytest.raises(UnreadableFileError, match="not a directory"):
        chapters(tmp_path)
    with pytest.raises(BinaryFileError):
        chapters(book(tmp_path, b"\x89PNG\0\0\0", "cover.png"))
    with pytest.raises(BinaryFileError):
        read_lines(book(tmp_path, "caf\xe9\n".encode("latin-1"), "latin.txt"), 1)
    with pytest.raises(ToolError, match="the book is empty"):
        chapters(book(tmp_path, "\n\n", "blank.txt"))


def test_refuses_a_huge_file(tmp_path: Path) -> None:
    path = tmp_path / "huge.txt"
    path.write_text("word " * 4_000_001)  # just over BOOK_MAX_BYTES
    with pytest.raises(FileTooLargeError, match="huge.txt"):
        chapters(path)


def test_follows_a_symlink_the_user_named(tmp_path: Path) -> None:
    real = book(tmp_path, NOVEL)
    (tmp_path / "shelf").mkdir()
    link = tmp_path / "shelf" / "link.txt"
    link.symlink_to(real)
    assert len(chapters(link)) == 4


# --- the real novels, when the shared data folder is there ---


def real_book(name: str) -> Path:
    path = BOOKS / name
    if not path.is_file():
        pytest.skip(f"{path} is not available")
    return path


def test_pride_and_prejudice_has_61_chapters() -> None:
    found = chapters(real_book("pride_and_prejudice.txt"))
    assert len(found) == 61
    assert (found[0].title, found[0].start_line) == ("Chapter 1", 1)
    assert found[-1].title == "Chapter 61"
    assert [c.index for c in found] == list(range(1, 62))


def test_moby_dick_has_135_chapters_and_an_epilogue() -> None:
    path = real_book("moby_dick.txt")
    found = chapters(path)
    assert len(found) == 136
    assert found[0].title == "CHAPTER 1. Loomings."
    assert found[41].title == "CHAPTER 42. The Whiteness of the Whale."
    assert found[-1].title == "Epilogue"
    assert read_chapter(path, 1, max_lines=1) == (
        "chapter 1: CHAPTER 1. Loomings. (lines 1-1 of 21114)\n"
        "   1| CHAPTER 1. Loomings.\n"
        "... truncated at 1 lines; read on with start=2"
    )
    assert "chapter 1, line 3: Call me Ishmael." in search_book(path, "call me ishmael")


def test_a_book_whose_name_is_not_utf8(tmp_path: Path) -> None:
    path = book(tmp_path, NOVEL, os.fsdecode(b"caf\xe9.txt"))
    assert list_chapters(path).splitlines()[0] == "caf\\xe9.txt: 4 chapters, 39 words"
    assert read_lines(path, 16).splitlines() == [
        "caf\\xe9.txt (lines 16-16 of 16)",
        "  16| The end.",
    ]
    # a name whose escapes would name another file is still this one
    other = book(tmp_path, "Chapter 1\n\nOther.\n", "notesA.txt")
    assert other.exists()
    assert "The Pequod" in read_lines(book(tmp_path, NOVEL, "notes\\x41.txt"), 13)
