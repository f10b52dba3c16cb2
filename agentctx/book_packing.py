"""Pack a book into a prompt context: the chapters most relevant to the question, in book
order, each line numbered with its line in the book so answers can cite it.

A chapter too big for a quarter of the budget is packed in pieces (cut at paragraph ends),
so a book whose chapters are all larger than the budget still gets its most relevant
passages; room left over goes to the best passage of the best chapter that did not fit.
Every chapter is named by its book or part and its lines: one title can recur in each book.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentctx.packing import OmittedFile, PackedContext, PackedFile, relevance
from agentctx.ranking import query_terms, term_counts
from tools.book import Chapter, book_lines, chapters

# Pieces are at most this share of the budget, so that several passages fit, and at least
# this many tokens (a smaller budget gets the best passage of one piece).
PIECE_SHARE = 0.25
MIN_PIECE_TOKENS = 512
# Fewer lines than this are not worth a passage of their own.
MIN_PASSAGE_LINES = 8
# Warn when the packed text is under this share of the budget (big chapters left room
# unused) or under this share of the book.
WARN_BUDGET_SHARE = 0.25
WARN_BOOK_SHARE = 0.01


@dataclass(slots=True)
class _Unit:
    name: str  # for the manifest: part / title (lines a-b)
    heading: str  # for the rendering's header
    start: int
    end: int
    text: str = ""
    tokens: int = 0


def render_chapter(title: str, lines: list[str], start: int) -> str:
    end = start + len(lines) - 1
    width = len(str(end))
    out = [f"=== {title} (lines {start}-{end}) ==="]
    out += [
        f"{n:>{width}}| {line}" if line else f"{n:>{width}}|" for n, line in enumerate(lines, start)
    ]
    return "\n".join(out) + "\n"


def pack_book(
    book_path: str, question: str, count_tokens: Callable[[str], int], budget_tokens: int
) -> PackedContext:
    lines = book_lines(book_path)
    budget = max(budget_tokens, 0)
    piece_limit = max(int(budget * PIECE_SHARE), MIN_PIECE_TOKENS)
    units: list[_Unit] = []
    for c in chapters(book_path):
        units += _units_of(c, lines, piece_limit, count_tokens)
    scores = relevance({str(i): _body(lines, u) for i, u in enumerate(units)}, question)
    # the most relevant units that fit, ties (no match) in book order; the best one that does
    # not fit gives its best passage to the room left, ahead of the units that match nothing
    chosen: dict[int, _Unit] = {}
    truncated: dict[int, _Unit] = {}
    used = 0
    ranked = sorted(range(len(units)), key=lambda i: (-scores[str(i)], i))
    for i in ranked:
        if used + units[i].tokens <= budget:
            chosen[i] = units[i]
            used += units[i].tokens
        elif not truncated and scores[str(i)] > 0:
            passage = _best_passage(units[i], lines, question, budget - used, count_tokens)
            if passage is not None:
                truncated[i] = passage
                used += passage.tokens
    if not chosen and not truncated and units:  # no word matches: the head of the first
        passage = _best_passage(units[ranked[0]], lines, question, budget, count_tokens)
        if passage is not None:
            truncated[ranked[0]] = passage
            used += passage.tokens
    order = sorted(set(chosen) | set(truncated))
    text = "".join((chosen.get(i) or truncated[i]).text for i in order)
    files = [
        PackedFile(units[i].name, chosen[i].tokens)
        if i in chosen
        else PackedFile(truncated[i].name, truncated[i].tokens, "truncated")
        for i in order
    ]
    omitted = [
        OmittedFile(u.name, u.tokens, "budget")
        if i not in truncated
        else OmittedFile(truncated[i].name, u.tokens - truncated[i].tokens, "truncated")
        for i, u in enumerate(units)
        if i not in chosen
    ]
    book_tokens = sum(u.tokens for u in units)
    warnings = _warnings(used, budget, book_tokens, bool(omitted), len(files))
    return PackedContext(text, files, omitted, used, None, None, budget, warnings)


def _units_of(c: Chapter, lines: list[str], limit: int, count_tokens) -> list[_Unit]:
    """The chapter whole, or in pieces of at most `limit` tokens cut at paragraph ends."""
    heading = f"{c.part} / {c.title}" if c.part else c.title
    whole = _Unit(c.label, heading, c.start_line, c.end_line)
    _render(whole, lines, count_tokens)
    if whole.tokens <= limit or c.end_line - c.start_line < 2 * MIN_PASSAGE_LINES:
        return [whole]
    per_piece = max(int(limit / whole.tokens * (c.end_line - c.start_line + 1) * 0.9), 1)
    pieces: list[_Unit] = []
    start = c.start_line
    while start <= c.end_line:
        end = _paragraph_end(lines, start, min(start + per_piece - 1, c.end_line), c.end_line)
        where = f"{heading}, piece {len(pieces) + 1}"
        piece = _Unit("", where, start, end)
        _render(piece, lines, count_tokens)
        while piece.tokens > limit and piece.end > piece.start:  # an odd dense stretch
            piece.end = piece.start + (piece.end - piece.start) // 2
            _render(piece, lines, count_tokens)
        piece.name = f"{where} (lines {piece.start}-{piece.end})"
        pieces.append(piece)
        start = piece.end + 1
    return pieces


def _paragraph_end(lines: list[str], start: int, target: int, last: int) -> int:
    """The last blank line at or before target (past the piece's first lines), else target."""
    if target >= last:
        return last
    for number in range(target, start + MIN_PASSAGE_LINES - 1, -1):
        if not lines[number - 1].strip():
            return number
    return target


def _render(unit: _Unit, lines: list[str], count_tokens) -> None:
    unit.text = render_chapter(unit.heading, lines[unit.start - 1 : unit.end], unit.start)
    unit.tokens = count_tokens(unit.text)


def _body(lines: list[str], unit: _Unit) -> str:
    return "\n".join(lines[unit.start - 1 : unit.end])


def _best_passage(unit: _Unit, lines, question, room, count_tokens) -> _Unit | None:
    """The unit's lines that fit in room: the window with the most question words, or its
    head when no word matches."""
    if room <= 0:
        return None
    span = unit.end - unit.start + 1
    size = min(int(room / max(unit.tokens, 1) * span), span - 1)
    terms = query_terms(question)
    hits = [sum(n for t, n in term_counts(line, False).items() if t in terms)
            for line in lines[unit.start - 1 : unit.end]]  # fmt: skip
    while size >= MIN_PASSAGE_LINES:
        window = sum(hits[:size])
        top, at = window, 0
        for offset in range(1, span - size + 1):
            window += hits[offset + size - 1] - hits[offset - 1]
            if window > top:
                top, at = window, offset
        start = unit.start + at
        passage = _Unit("", "", start, start + size - 1)
        passage.heading = f"{unit.heading}, part of lines {unit.start}-{unit.end}"
        passage.name = (
            f"{unit.heading} (lines {passage.start}-{passage.end} of {unit.start}-{unit.end})"
        )
        _render(passage, lines, count_tokens)
        if passage.tokens <= room:
            return passage
        size = min(size - 1, int(size * room / passage.tokens * 0.95))
    return None


def _warnings(used: int, budget: int, book: int, omitted: bool, packed: int) -> list[str]:
    if not packed:
        return [f"nothing of the book fits in the {budget:,}-token budget"]
    out = []
    if omitted and used < budget * WARN_BUDGET_SHARE:
        out.append(
            f"almost nothing fits: {used:,} tokens of a {budget:,}-token budget are packed; "
            "what was left out is larger than the room left"
        )
    if omitted and used < book * WARN_BOOK_SHARE:
        out.append(
            f"almost nothing fits: {used:,} of the book's {book:,} tokens "
            f"({used / max(book, 1):.1%}); the answer rests on a small part of the book"
        )
    return out
