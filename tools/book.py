"""Navigate a book kept as one plain-text or markdown file: chapters, lines, search."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tools.book_headings import find_headings
from tools.errors import ToolError, UnreadableFileError
from tools.fold import fold, fold_with_offsets, original_index
from tools.grep import clip_around, compile_pattern
from tools.names import printable, show_path
from tools.read_file import format_range, split_lines
from tools.repo_files import read_text

# Moby-Dick is 1.2 MB; a long book is a few MB. Beyond this it is not one book.
BOOK_MAX_BYTES = 20_000_000
# Without headings the book is cut into parts of this many lines.
PART_LINES = 500

_MARKDOWN = re.compile(r"^#{1,2}\s+(\S.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Chapter:
    index: int  # 0 only for front matter before the first heading
    title: str
    start_line: int
    end_line: int
    words: int
    part: str = ""  # the book, part or volume it is in ("BOOK ONE: 1805"), "" when none

    @property
    def label(self) -> str:
        """The chapter named so that no other has the same name: its part and its lines."""
        where = f"{self.part} / {self.title}" if self.part else self.title
        return f"{where} (lines {self.start_line}-{self.end_line})"


def chapters(book_path: str | os.PathLike[str]) -> list[Chapter]:
    return _split(_lines(book_path))


def list_chapters(book_path: str | os.PathLike[str]) -> str:
    """chapters() as text for the model."""
    found = chapters(book_path)
    total = sum(chapter.words for chapter in found)
    out = [f"{printable(Path(book_path).name)}: {len(found)} chapters, {total:,} words"]
    for c in found:
        title = f"{c.part} / {c.title}" if c.part else c.title
        out.append(f"{c.index:>3}. {title} (lines {c.start_line}-{c.end_line}, {c.words:,} words)")
    return "\n".join(out)


def read_chapter(book_path: str | os.PathLike[str], index: int, max_lines: int = 1000) -> str:
    lines = _lines(book_path)
    found = _split(lines)
    by_index = {chapter.index: chapter for chapter in found}
    if index not in by_index:
        first, last = found[0].index, found[-1].index
        raise ToolError(f"no chapter {index}: chapters run from {first} to {last}")
    c = by_index[index]
    label = f"chapter {c.index}: {c.title}"
    return format_range(label, lines, c.start_line, c.end_line, max_lines)


def read_lines(
    book_path: str | os.PathLike[str], start: int, end: int | None = None, max_lines: int = 400
) -> str:
    label = printable(Path(book_path).name)
    return format_range(label, _lines(book_path), start, end, max_lines)


def search_book(
    book_path: str | os.PathLike[str], query: str, max_matches: int = 50, regex: bool = False
) -> str:
    """Case-insensitive search for a substring, or for a Python regex when regex is true.
    Accents do not matter: "Borodino" finds "Borodinó" (both sides are folded)."""
    if not query:
        raise ToolError("query is empty")
    if max_matches < 1:
        raise ToolError(f"max_matches must be 1 or more, got {max_matches}")
    folded = fold(query)
    pattern = compile_pattern(folded if regex else re.escape(folded), ignore_case=True)
    lines = _lines(book_path)
    found = _split(lines)
    out: list[str] = []
    count = 0
    chapter_at = iter(found)
    current = next(chapter_at)
    for number, line in enumerate(lines, 1):
        text, offsets = (line.casefold(), None) if line.isascii() else fold_with_offsets(line)
        match = pattern.search(text)
        if match is None:
            continue
        while number > current.end_line:
            current = next(chapter_at)
        count += 1
        if count <= max_matches:
            at = (
                match.start()
                if offsets is None
                else original_index(offsets, match.start(), len(line))
            )
            out.append(f"chapter {current.index}, line {number}: {clip_around(line, at)}")
    if not out:
        return f"no matches for {query!r}"
    if count > max_matches:
        out.append(f"... {count - max_matches} more matches")
    return "\n".join(out)


def book_lines(book_path: str | os.PathLike[str]) -> list[str]:
    """The book's lines (validated: exists, one text file, not empty)."""
    return _lines(book_path)


def _lines(book_path: str | os.PathLike[str]) -> list[str]:
    shown = printable(os.fspath(book_path))
    try:
        path = Path(book_path).expanduser()
        if not path.exists():
            raise UnreadableFileError(f"book not found: {shown}")
        if path.is_dir():
            raise UnreadableFileError(f"a book is one text file, not a directory: {shown}")
        # the user named this file, so a symlink is followed; its own directory is the root
        path = path.resolve()
    except (OSError, RuntimeError) as e:  # a name too long, ~nosuchuser
        reason = getattr(e, "strerror", None) or e
        raise UnreadableFileError(f"cannot read the book {shown}: {reason}") from None
    # show_path's form is what read_text reads back as exactly this name
    lines = split_lines(read_text(path.parent, show_path(path.name), max_bytes=BOOK_MAX_BYTES))
    if not any(line.strip() for line in lines):
        raise ToolError(f"the book is empty: {printable(os.fspath(book_path))}")
    return lines


def _split(lines: list[str]) -> list[Chapter]:
    headings = find_headings(lines)
    starts = [(h.line, h.title, h.part) for h in headings] or [
        (n, title, "") for n, title in _markdown_headings(lines)
    ]
    if not starts:
        starts = [
            (n, f"part {i}", "") for i, n in enumerate(range(1, len(lines) + 1, PART_LINES), 1)
        ]
    found: list[Chapter] = []
    first = starts[0][0]
    if first > 1 and _words(lines, 1, first - 1):
        found.append(Chapter(0, "(front matter)", 1, first - 1, _words(lines, 1, first - 1)))
    bounds = [n for n, _, _ in starts[1:]] + [len(lines) + 1]
    for i, ((start, title, part), next_start) in enumerate(zip(starts, bounds, strict=True), 1):
        end = next_start - 1
        found.append(Chapter(i, title, start, end, _words(lines, start, end), part))
    return found


def _markdown_headings(lines: list[str]) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    in_fence = False
    for number, line in enumerate(lines, 1):
        if _FENCE.match(line):
            in_fence = not in_fence  # a "# comment" inside a code block is no heading
            continue
        match = None if in_fence else _MARKDOWN.match(line)
        if match:
            found.append((number, match.group(1)))
    return found


def _words(lines: list[str], start: int, end: int) -> int:
    return sum(len(line.split()) for line in lines[start - 1 : end])
