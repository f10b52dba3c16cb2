"""Packing a book: the most relevant chapters within the budget, in book order, numbered with
the book's own line numbers, named by their part and lines; a chapter bigger than the room
is packed in pieces rather than not at all, and a budget that holds almost nothing warns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentctx.book_packing import pack_book
from agentctx.packing import summary_line

BOOKS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "books"


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


def names(packed) -> list[str]:
    return [f.path for f in packed.files]


def test_relevant_chapters_in_book_order_within_budget(book):
    packed = pack_book(str(book), "What did the lighthouse keeper do?", words, budget_tokens=520)
    # the relevant chapters, then what still fits (the short front matter), in book order
    assert names(packed) == [
        "(front matter) (lines 1-2)",
        "Chapter 2 (lines 7-10)",
        "Chapter 4 (lines 15-18)",
    ]
    assert packed.tokens <= 520 and packed.warnings == []
    assert {o.path for o in packed.omitted} == {"Chapter 1 (lines 3-6)", "Chapter 3 (lines 11-14)"}
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


def unheaded_book(tmp_path: Path) -> Path:
    """1,500 lines with no heading the splitter knows: three 500-line blocks, each far
    bigger than the budgets below; the one passage about the lantern is in the second."""
    rows = []
    for i in range(1500):
        rows.append("" if i % 5 == 4 else f"The sea was grey and the wind was cold, line {i}.")
    rows[742] = "Borodinó: the old lantern burned green all night in the tower."
    path = tmp_path / "unheaded.txt"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_book_of_blocks_bigger_than_the_budget_packs_pieces_not_nothing(tmp_path):
    path = unheaded_book(tmp_path)

    packed = pack_book(str(path), "Why did the lantern burn green?", words, budget_tokens=2_500)

    assert packed.files and packed.tokens <= 2_500
    assert packed.tokens > 2_500 // 2  # the room is used, in pieces
    assert any("743| Borodinó: the old lantern" in line for line in packed.text.splitlines())
    piece = re.compile(r"^part \d+, piece \d+ \(lines \d+-\d+( of \d+-\d+)?\)$")
    assert all(piece.match(name) for name in names(packed))
    assert "packed 0" not in summary_line(packed, "chapter")


def test_accents_do_not_matter_on_either_side(tmp_path):
    path = unheaded_book(tmp_path)

    packed = pack_book(str(path), "What happened at Borodino?", words, budget_tokens=600)

    assert "Borodinó: the old lantern" in packed.text


def test_a_tiny_budget_packs_the_best_passage_and_warns(tmp_path):
    path = unheaded_book(tmp_path)

    packed = pack_book(str(path), "Why did the lantern burn green?", words, budget_tokens=150)

    assert [f.packed for f in packed.files] == ["truncated"]
    assert "Borodinó: the old lantern" in packed.text and packed.tokens <= 150
    assert packed.warnings and packed.warnings[0].startswith("almost nothing fits")
    nothing = pack_book(str(path), "Why did the lantern burn green?", words, budget_tokens=0)
    assert nothing.files == [] and nothing.warnings == [
        "nothing of the book fits in the 0-token budget"
    ]


def test_chapters_are_named_by_their_book_and_lines(tmp_path):
    text = ""
    for book in ("ONE: 1805", "TWO: 1806"):
        text += f"BOOK {book}\n\n"
        for chapter in ("I", "II"):
            text += f"CHAPTER {chapter}\n\n" + f"Prince Andrew in book {book}. " * 20 + "\n\n"
    path = tmp_path / "war.txt"
    path.write_text(text)

    packed = pack_book(str(path), "Where was Prince Andrew?", words, budget_tokens=10_000)

    assert names(packed) == [
        "BOOK ONE: 1805 / CHAPTER I (lines 1-6)",
        "BOOK ONE: 1805 / CHAPTER II (lines 7-10)",
        "BOOK TWO: 1806 / CHAPTER I (lines 11-16)",
        "BOOK TWO: 1806 / CHAPTER II (lines 17-20)",
    ]
    assert packed.text.startswith("=== BOOK ONE: 1805 / CHAPTER I (lines 1-6) ===\n1| BOOK ONE")


def real_book(name: str) -> Path:
    path = BOOKS / name
    if not path.is_file():
        pytest.skip(f"{path} is not available")
    return path


def test_real_novel_if_present():
    novel = real_book("moby_dick.txt")
    packed = pack_book(
        str(novel), "What happened to the Pequod at the end?", words, budget_tokens=6000
    )
    assert packed.files and 6000 // 2 < packed.tokens <= 6000
    # the chapters that fit are whole; the bigger ones were cut into pieces to compete
    wholes = {re.sub(r", piece \d+ \(lines.*", "", f.path) for f in packed.files + packed.omitted}
    assert len({re.sub(r" \(lines.*", "", w) for w in wholes}) == 136
