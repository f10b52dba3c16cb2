"""Where a book's chapters start, for the heading styles novels use.

Chapter headings: "CHAPTER I.", "Chapter 12. Title", "CHAPTER I—M. MYRIEL", "Chapter the
First", "LETTER 4", "STAVE ONE"; where a book has none of those, numerals alone on a line
("I", "XII.", "3", "I. A SCANDAL IN BOHEMIA") when they count up 1, 2, 3... Containers above
the chapters: "BOOK ONE: 1805", "PART I", "VOLUME II—COSETTE", "BOOK FIRST", "FIRST
EPILOGUE"; a chapter is named with its container, since "CHAPTER I" recurs in every book.
A heading stands after a blank line and has text of its own before the next heading, which
skips a table of contents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS_TEXT = (
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
)
_TENS_TEXT = "twenty thirty forty fifty sixty seventy eighty ninety"
_ORDINAL_UNITS_TEXT = (
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
    "thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth"
)
_ORDINAL_TENS_TEXT = "twentieth thirtieth fortieth fiftieth sixtieth seventieth eightieth ninetieth"
_UNITS, _TENS = _UNITS_TEXT.split(), _TENS_TEXT.split()
_ORDINAL_UNITS = _ORDINAL_UNITS_TEXT.split()
_NUMBER_WORDS = (
    _UNITS
    + _ORDINAL_UNITS
    + [f"{ten}[- ]{unit}" for ten in _TENS for unit in _UNITS[:9] + _ORDINAL_UNITS[:9]]
    + _TENS
    + _ORDINAL_TENS_TEXT.split()
)
# longest first, so "twenty-one" is not read as "twenty"
_WORDS = "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True))
# a roman numeral in its canonical form, so "did" or "mild" is no number
_ROMAN_TEXT = r"(?=[ivxlcdm])m{0,3}(?:cm|cd|d?c{0,3})(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3})"
_NUMBER = rf"(?:\d{{1,4}}|{_ROMAN_TEXT}|(?:the\s+)?(?:{_WORDS}))"
# what may follow the number: nothing, or punctuation then a title. The punctuation rule
# keeps prose such as "Chapter I think..." or "Part of the..." from being taken as a heading.
_TAIL = r"(?:\s*$|\s*[.:]\s*\S.*$|\s*[.:]$|\s*[-–—]+\s*\S.*$)"
_CHAPTER = re.compile(rf"^\s{{0,4}}(?:chapter|letter|stave|canto)\s+{_NUMBER}\b{_TAIL}", re.I)
_CONTAINER = re.compile(
    rf"^\s{{0,4}}(?:(?:book|part|volume)\s+{_NUMBER}\b|(?:first|second|third|final)\s+epilogue\b)"
    rf"{_TAIL}",
    re.I,
)
# Sections with no number that books still open with a heading line of their own.
_SECTION = re.compile(
    r"^\s{0,4}(?:prologue|epilogue|preface|introduction|afterword|foreword|conclusion)\.?\s*$",
    re.I,
)
# A numeral alone ("XII", "3."), or with a title after a period ("I. A SCANDAL IN BOHEMIA").
_BARE = re.compile(r"^\s{0,4}([IVXLCDM]{1,8}|\d{1,3})(?:\.?\s*$|\.\s+\S.{0,80}$)")
_ROMAN = re.compile(r"^M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})$")
_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
# Bare numerals are taken as headings only when this many count up in runs.
MIN_BARE_HEADINGS = 3
MAX_HEADING_CHARS = 100


@dataclass(frozen=True, slots=True)
class Heading:
    line: int  # 1-based line of the heading
    title: str
    part: str  # the container it is in ("BOOK ONE: 1805"), "" when none


def find_headings(lines: list[str]) -> list[Heading]:
    """Where chapters start, in order; [] when the book has no chapter headings."""
    candidates = [
        number
        for number, line in enumerate(lines, 1)
        if (number == 1 or not lines[number - 2].strip()) and 0 < len(line) < MAX_HEADING_CHARS
    ]
    chapters = [n for n in candidates if _CHAPTER.match(lines[n - 1])]
    # a container or a bare numeral must also stand apart below ("BOOK I. (Folio)..." can
    # open a paragraph), with at most a one-line subtitle before the blank line
    apart = [n for n in candidates if _stands_apart(lines, n)]
    if not chapters:
        chapters = _bare_runs(lines, apart)
    containers = [n for n in apart if _CONTAINER.match(lines[n - 1])]
    if len(containers) < 2:
        containers = []  # one "Part I" line names nothing: every chapter would be in it
    sections = [n for n in candidates if _SECTION.match(lines[n - 1])]
    if not chapters:
        if not containers:
            return []  # a lone "Introduction" or "Part I" does not make chapters
        chapters, containers = containers, []
    starts = sorted(set(chapters) | set(sections))
    heading_lines = set(starts) | set(containers)
    # a heading followed by nothing but more headings is a table of contents entry
    starts = _with_text(lines, starts, heading_lines)
    containers = [
        n
        for i, n in enumerate(containers)
        if _with_text(lines, [n], heading_lines, until=_peers_after(lines, containers[i:]))
    ]
    return _named(lines, starts, containers)


def _stands_apart(lines: list[str], number: int) -> bool:
    """Whether a blank line (or the end) follows the line, or follows the one after it."""
    rest = lines[number : number + 2]
    return not rest or not rest[0].strip() or len(rest) < 2 or not rest[1].strip()


def _with_text(lines, starts, headings, until=None) -> list[int]:
    """The starts with a line of text (not a heading) before the next start in `until`
    (default: the next of `starts`)."""
    bounds = sorted(until if until is not None else starts)
    kept = []
    for start in starts:
        after = [b for b in bounds if b > start]
        end = after[0] - 1 if after else len(lines)
        if any(_is_text(lines, n, headings) for n in range(start + 1, end + 1)):
            kept.append(start)
    return kept


def _peers_after(lines: list[str], containers: list[int]) -> list[int]:
    """The first container's line, and the next container at its level or above."""
    level = _level(lines[containers[0] - 1].strip())
    after = [n for n in containers[1:] if _level(lines[n - 1].strip()) <= level]
    return containers[:1] + after[:1]


def _is_text(lines: list[str], number: int, headings: set[int]) -> bool:
    line = lines[number - 1]
    return bool(line.strip()) and number not in headings and not is_heading(line)


def _named(lines: list[str], starts: list[int], containers: list[int]) -> list[Heading]:
    """Headings with their containers ("VOLUME I / BOOK FIRST"). A container with only
    blank lines (or more containers) before the next chapter starts that chapter; one with
    text of its own (a preface to the book) is a chapter itself."""
    container_set = set(containers)
    start_set = set(starts)
    for container in containers:
        following = [s for s in starts if s > container]
        between = range(container + 1, following[0] if following else len(lines) + 1)
        if any(_is_text(lines, n, container_set) for n in between):
            start_set.add(container)
    found: list[Heading] = []
    levels: dict[int, str] = {}  # container level -> its title
    pending: int | None = None  # where the next chapter starts: at its containers' line
    for number in sorted(start_set | container_set):
        title = lines[number - 1].strip()
        if number in container_set:
            level = _level(title)
            levels = {k: v for k, v in levels.items() if k < level}
            if number in start_set:
                found.append(Heading(number, title, " / ".join(levels.values())))
                pending = None
            elif pending is None:
                pending = number
            levels[level] = title
            continue
        found.append(Heading(pending or number, title, " / ".join(levels.values())))
        pending = None
    return found


def _level(title: str) -> int:
    """Volumes hold books, books hold parts; epilogues stand where books do."""
    word = title.split()[0].lower()
    return {"volume": 0, "book": 1, "part": 2}.get(word, 1)


def _bare_runs(lines: list[str], candidates: list[int]) -> list[int]:
    """Bare numerals that count up 1, 2, 3... (runs of two or more; a run restarts at 1)."""
    runs: list[list[int]] = []
    run: list[int] = []
    last = 0
    for number in candidates:
        match = _BARE.match(lines[number - 1])
        value = _value(match.group(1)) if match else None
        if value is None:
            continue
        if value == last + 1 and run:
            run.append(number)
        elif value == 1:
            runs.append(run)
            run = [number]
        else:
            continue
        last = value
    runs.append(run)
    kept = [n for r in runs if len(r) >= 2 for n in r]
    return kept if len(kept) >= MIN_BARE_HEADINGS else []


def _value(numeral: str) -> int | None:
    if numeral.isdigit():
        return int(numeral)
    if not _ROMAN.match(numeral):
        return None
    total = 0
    for char, following in zip(numeral, numeral[1:] + " ", strict=True):
        value = _ROMAN_VALUES[char]
        total += -value if following != " " and _ROMAN_VALUES[following] > value else value
    return total


def is_heading(line: str) -> bool:
    return bool(_CHAPTER.match(line) or _SECTION.match(line) or _CONTAINER.match(line))
