"""Pack a book into a prompt context: the chapters most relevant to the question, in book
order, each line numbered with its line in the book so answers can cite it."""

from __future__ import annotations

from collections.abc import Callable

from agentctx.packing import OmittedFile, PackedContext, PackedFile, relevance
from tools.book import book_lines, chapters


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
    parts = chapters(book_path)
    titles = {c.index: c.title for c in parts}
    texts = {str(c.index): "\n".join(lines[c.start_line - 1 : c.end_line]) for c in parts}
    scores = relevance(texts, question)
    rendered = {
        c.index: render_chapter(titles[c.index], lines[c.start_line - 1 : c.end_line], c.start_line)
        for c in parts
    }
    tokens = {i: count_tokens(text) for i, text in rendered.items()}
    # the most relevant chapters that fit; ties (no match) keep book order
    chosen, used = [], 0
    for c in sorted(parts, key=lambda c: (-scores[str(c.index)], c.index)):
        if used + tokens[c.index] <= budget_tokens:
            chosen.append(c.index)
            used += tokens[c.index]
    chosen.sort()
    omitted = [
        OmittedFile(titles[c.index], tokens[c.index], "budget")
        for c in parts
        if c.index not in chosen
    ]
    text = "".join(rendered[i] for i in chosen)
    return PackedContext(
        text=text,
        files=[PackedFile(titles[i], tokens[i]) for i in chosen],
        omitted=omitted,
        tokens=used,
        commit=None,
    )
