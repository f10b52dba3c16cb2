"""Packing a book: the most relevant chapters within the budget, in book order, numbered with
the book's own line numbers; what did not fit is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentctx.book_packing import pack_book


def words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def book(tmp_path) -> Path:
    chapters = {
        "Chapter 1": "The harbour was quiet. " * 30,
        "Chapter 2": "A whale surfaced near the lighthouse keeper. " * 30,
        "Chapter 3": "Dinner at the inn, and talk of the weather. " * 30,
        "Chapter 4": "The lighthouse keeper climbed the stairs at midnight. " * 30,
    }
    text = "A Small Book\n\n" + "".join(
        f"{title}\n\n{body}\n\n" for title, body in chapters.items()
    )
    path = tmp_path / "book.txt"
    path.write_text(text)
    return path


def test_relevant_chapters_in_book_order_within_budget(book):
    packed = pack_book(str(book), "What did the lighthouse keeper do?", words, budget_tokens=520)
    titles = [f.path for f in packed.files]
    # the relevant chapters, then what still fits (the short front matter), in book order
    assert titles == ["(front matter)", "Chapter 2", "Chapter 4"]
    assert packed.tokens <= 520
    assert {o.path for o in packed.omitted} == {"Chapter 1", "Chapter 3"}
    assert all(o.reason == "budget" and o.tokens for o in packed.omitted)


def test_line_numbers_are_the_books(book):
    packed = pack_book(str(book), "lighthouse keeper midnight", words, budget_tokens=400)
    lines = book.read_text().splitlines()
    rendered = packed.text.splitlines()
    at = next(i for i, line in enumerate(rendered) if line.startswith("=== Chapter 4 (lines "))
    for row in rendered[at + 1 : at + 4]:
        number, _, text = row.partition("|")
        assert lines[int(number) - 1].strip() == text.strip()
    assert lines[int(rendered[at + 1].partition("|")[0]) - 1] == "Chapter 4"


def test_real_novel_if_present():
    novel = (
        Path(__file__).resolve().parents[2].parent / "shared" / "data" / "books" / "moby_dick.txt"
    )
    if not novel.is_file():
        pytest.skip("shared novels not present")
    packed = pack_book(
        str(novel), "What happened to the Pequod at the end?", words, budget_tokens=6000
    )
    assert packed.files and packed.tokens <= 6000
    assert len(packed.files) + len(packed.omitted) == 136
