"""Chapter headings in the styles novels use, containers named with their chapters, and a
book search that accents do not change."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools.book import chapters, list_chapters, search_book

BOOKS = Path(__file__).resolve().parents[3] / "shared" / "data" / "books"
BODY = "Some text of this chapter.\nAnd more of it.\n\n"


def book(tmp_path: Path, headings: list[str], name: str = "book.txt") -> Path:
    path = tmp_path / name
    path.write_text("A Title\n\n" + "".join(f"{h}\n\n{BODY}" for h in headings))
    return path


def titles(path: Path) -> list[str]:
    return [c.label.rsplit(" (lines", 1)[0] for c in chapters(path) if c.index]


@pytest.mark.parametrize(
    "headings",
    [
        ["CHAPTER I.", "CHAPTER II.", "CHAPTER III."],
        ["Chapter 1", "Chapter 2", "Chapter 3"],
        ["CHAPTER I—M. MYRIEL", "CHAPTER II—M. MYRIEL BECOMES M. WELCOME", "CHAPTER III"],
        ["Chapter the First", "Chapter the Second", "Chapter the Third"],
        ["STAVE ONE", "STAVE TWO", "STAVE THREE"],
        ["LETTER 1", "LETTER 2", "LETTER 3"],
        ["I", "II", "III"],
        ["I.", "II.", "III."],
        ["1.", "2.", "3."],
        ["I. A SCANDAL IN BOHEMIA", "II. THE RED-HEADED LEAGUE", "III. A CASE OF IDENTITY"],
        ["PART I", "PART II", "PART III"],
        ["BOOK ONE", "BOOK TWO", "BOOK THREE"],
    ],
)
def test_heading_styles(tmp_path: Path, headings: list[str]) -> None:
    assert titles(book(tmp_path, headings)) == headings


def test_prose_is_no_heading(tmp_path: Path) -> None:
    path = tmp_path / "prose.txt"
    lines = ["Chapter I think was the best.", "Part of the road was wet.", "I", "Book did."]
    path.write_text("".join(f"{line}\n\n{BODY}" for line in lines))
    assert [c.title for c in chapters(path)] == ["part 1"]  # no heading: fixed parts


def test_bare_numerals_must_count_up(tmp_path: Path) -> None:
    # a lone "IV" or "12" in the text is no chapter; the runs 1, 2, 3 are
    path = book(tmp_path, ["I", "II", "12", "III", "IV."])
    assert titles(path) == ["I", "II", "III", "IV."]


def test_chapters_are_named_with_their_book_and_part(tmp_path: Path) -> None:
    headings = [
        "VOLUME I—FANTINE", "BOOK FIRST—A JUST MAN", "CHAPTER I—M. MYRIEL", "CHAPTER II",
        "BOOK SECOND—THE FALL", "CHAPTER I", "VOLUME II—COSETTE", "BOOK FIRST—WATERLOO",
        "CHAPTER I",
    ]  # fmt: skip
    path = tmp_path / "lesmis.txt"
    # a container's heading stands right above the chapter it opens
    text = "".join(
        f"{h}\n\n" if not h.startswith("CHAPTER") else f"{h}\n\n{BODY}" for h in headings
    )
    path.write_text(text)

    found = chapters(path)

    assert [c.label for c in found] == [
        "VOLUME I—FANTINE / BOOK FIRST—A JUST MAN / CHAPTER I—M. MYRIEL (lines 1-9)",
        "VOLUME I—FANTINE / BOOK FIRST—A JUST MAN / CHAPTER II (lines 10-14)",
        "VOLUME I—FANTINE / BOOK SECOND—THE FALL / CHAPTER I (lines 15-21)",
        "VOLUME II—COSETTE / BOOK FIRST—WATERLOO / CHAPTER I (lines 22-30)",
    ]
    assert found[0].start_line == 1 and found[0].part == "VOLUME I—FANTINE / BOOK FIRST—A JUST MAN"
    assert "  3. VOLUME I—FANTINE / BOOK SECOND—THE FALL / CHAPTER I (lines 15-21" in (
        list_chapters(path)
    )


def test_a_container_with_text_of_its_own_is_a_chapter(tmp_path: Path) -> None:
    path = tmp_path / "war.txt"
    path.write_text(
        "BOOK ONE: 1805\n\nA preface to the book.\n\nCHAPTER I\n\n" + BODY
        + "FIRST EPILOGUE: 1813 - 20\n\nCHAPTER I\n\n" + BODY
    )  # fmt: skip
    assert [c.label for c in chapters(path)] == [
        "BOOK ONE: 1805 (lines 1-4)",
        "BOOK ONE: 1805 / CHAPTER I (lines 5-9)",
        "FIRST EPILOGUE: 1813 - 20 / CHAPTER I (lines 10-16)",
    ]


def test_search_ignores_accents_on_both_sides(tmp_path: Path) -> None:
    path = tmp_path / "war.txt"
    path.write_text(
        "Chapter 1\n\nThe field at Borodinó was quiet.\n\nChapter 2\n\nKUTÚZOV slept.\n"
    )

    assert search_book(path, "borodino") == "chapter 1, line 3: The field at Borodinó was quiet."
    assert search_book(path, "Borodinó") == search_book(path, "BORODINO")
    assert search_book(path, "kutuzov slept") == "chapter 2, line 7: KUTÚZOV slept."
    assert search_book(path, r"kut.zov", regex=True).startswith("chapter 2, line 7")


def real_book(name: str) -> Path:
    path = BOOKS / name
    if not path.is_file():
        pytest.skip(f"{path} is not available")
    return path


def roman(number: int) -> str:
    out = ""
    for value, numeral in ((50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV")):
        while number >= value:
            out, number = out + numeral, number - value
    return out + "I" * number


WORDS = ["ONE", "TWO", "THREE", "FOUR"]
RESTYLED = {
    "numerals alone": lambda n: [roman(n)],
    "numerals with a period": lambda n: [f"{roman(n)}."],
    "CHAPTER I.": lambda n: [f"CHAPTER {roman(n)}."],
    "books of twenty chapters": lambda n: (
        [f"BOOK {WORDS[(n - 1) // 20]}: 18{n // 20 + 5:02}", ""] if n % 20 == 1 else []
    ) + [f"CHAPTER {roman((n - 1) % 20 + 1)}"],
}  # fmt: skip


@pytest.mark.parametrize("style", RESTYLED)
def test_pride_and_prejudice_in_other_heading_styles(tmp_path: Path, style: str) -> None:
    source = real_book("pride_and_prejudice.txt").read_text().split("\n")
    restyle = RESTYLED[style]
    out: list[str] = []
    for line in source:
        match = re.fullmatch(r"Chapter (\d+)", line)
        out += restyle(int(match.group(1))) if match else [line]
    path = tmp_path / "pp.txt"
    path.write_text("\n".join(out))

    found = chapters(path)

    assert len(found) == 61 and [c.index for c in found] == list(range(1, 62))
    assert len({c.label for c in found}) == 61  # named apart even where titles recur
    if style == "books of twenty chapters":
        assert found[20].label.startswith("BOOK TWO: 1806 / CHAPTER I (lines ")
        assert found[20].title == found[0].title == "CHAPTER I"
