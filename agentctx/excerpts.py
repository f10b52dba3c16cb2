"""The definitions a question is about, shown again right before it.

A small model answers from what it read last: given a whole file, asked which function does
something, it names a plausible neighbour. So after the files, the packed context repeats
the few classes and functions (from every file, packed or only in the map) whose own text
best matches the question, each with its path and line numbers, as the last thing before
the question. Each definition is a chunk from its line to the next definition's (a class's
chunk is its head: its docstring and attributes; its methods are chunks of their own), with
the comments and decorators just above it; chunks are ranked by the same BM25 as files
(agentctx.ranking), the class and function names counting as names the chunk defines.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from agentctx.code_outline import Symbol
from agentctx.ranking import is_boilerplate, is_overview, relevance

# At most this many definitions, each at most this many lines, and all of them at most this
# share of the packing budget; a definition scoring under this fraction of the best is left
# out, since it matches only the question's common words.
MAX_EXCERPTS = 4
MAX_EXCERPT_LINES = 40
EXCERPT_SHARE = 0.15
MIN_SCORE_SHARE = 0.3
# Below this budget the files themselves need every token.
MIN_BUDGET = 1024
# Words that frame a question about code ("Which function ... Name the file, citing it as
# path:line") and match every definition's text: they do not say which one is meant.
_FRAME_TEXT = (
    "function functions method methods class classes file files name names path paths line "
    "lines cite citing cited define defines defined definition code repository where which "
    "what"
)
FRAME_WORDS = frozenset(_FRAME_TEXT.split())
_WORD = re.compile(r"\w+")
HEADER = "Definitions that match the question (shown again from the files above or the map):\n"


@dataclass(frozen=True, slots=True)
class Excerpt:
    path: str
    name: str  # "Class.method" for a member
    start: int  # first line shown, 1-based
    end: int  # last line shown
    tokens: int


@dataclass(frozen=True, slots=True)
class _Chunk:
    path: str
    name: str
    start: int
    end: int  # last line of the definition's chunk (it may show fewer)
    names: tuple[str, ...]  # the names it defines, the class first for a member


def chunks(path: str, lines: list[str], symbols: list[Symbol]) -> list[_Chunk]:
    """Each definition's span: from its comments and decorators to the line before the next
    definition (or the end of the file)."""
    ordered = sorted(symbols, key=lambda s: s.line)
    found: list[_Chunk] = []
    owner, outer = "", ()  # the class above, and the function above an inner one
    for index, symbol in enumerate(ordered):
        if symbol.depth == 0:
            owner = symbol.name if symbol.kind == "class" else ""
        if symbol.depth >= 2:  # an inner function: named within the one it is in
            names = (*outer, symbol.name)
        else:
            names = (owner, symbol.name) if symbol.depth and owner else (symbol.name,)
            outer = names
        start = _lead_in(lines, symbol.line)
        following = ordered[index + 1].line if index + 1 < len(ordered) else len(lines) + 1
        end = max(_lead_in(lines, following) - 1, symbol.line)
        found.append(_Chunk(path, ".".join(names), start, min(end, len(lines)), names))
    return found


def best_excerpts(
    lines_of: dict[str, list[str]],
    symbols: dict[str, list[Symbol]],
    question: str,
    count_tokens: Callable[[str], int],
    budget_tokens: int,
    project_names: frozenset[str] = frozenset(),
) -> tuple[str, list[Excerpt]]:
    """The rendered section (HEADER, then each definition) and what it holds; ("", []) for
    an overview question, a budget too small, or no definition that matches."""
    if budget_tokens < MIN_BUDGET or is_overview(question, project_names):
        return "", []
    found = [
        chunk
        for path, found_symbols in symbols.items()
        if found_symbols and not is_boilerplate(path)
        for chunk in chunks(path, lines_of[path], found_symbols)
    ]
    if not found:
        return "", []
    keyed = {f"{c.path}:{c.start}": c for c in found}
    texts = {key: "\n".join(lines_of[c.path][c.start - 1 : c.end]) for key, c in keyed.items()}
    names = {key: list(c.names) for key, c in keyed.items()}
    asked = _WORD.sub(lambda m: "" if m[0].casefold() in FRAME_WORDS else m[0], question)
    scores = relevance(texts, asked, names)
    ranked = sorted(keyed, key=lambda key: (-scores[key], key))
    best = scores[ranked[0]]
    if best <= 0:
        return "", []
    room = int(budget_tokens * EXCERPT_SHARE) - count_tokens(HEADER)
    parts: list[str] = []
    chosen: list[Excerpt] = []
    for key in ranked:
        if len(chosen) == MAX_EXCERPTS or scores[key] < best * MIN_SCORE_SHARE:
            break
        chunk = keyed[key]
        if any(e.path == chunk.path and e.name == chunk.name for e in chosen):
            continue  # an overload, or a name defined twice: its best chunk is shown
        end = min(chunk.end, chunk.start + MAX_EXCERPT_LINES - 1)
        text = render_excerpt(chunk, lines_of[chunk.path], end)
        tokens = count_tokens(text)
        if tokens > room:
            continue  # a smaller one further down may still fit
        room -= tokens
        parts.append(text)
        chosen.append(Excerpt(chunk.path, chunk.name, chunk.start, end, tokens))
    if not chosen:
        return "", []
    return HEADER + "".join(parts), chosen


def render_excerpt(chunk: _Chunk, lines: list[str], end: int) -> str:
    """A "--- name, path:start-end ---" header, then the numbered lines as the files show
    them ("  12| code"). The name comes first, beside its place: the models copy the
    header into their answers, and a bare path:line does not say which function it is."""
    width = len(str(end))
    out = [f"--- {chunk.name}, {chunk.path}:{chunk.start}-{end} ---"]
    for number in range(chunk.start, end + 1):
        line = lines[number - 1]
        out.append(f"{number:>{width}}| {line}" if line else f"{number:>{width}}|")
    if end < chunk.end:
        out.append(f"... ({chunk.end - end} more lines of {chunk.name})")
    return "\n".join(out) + "\n"


def _lead_in(lines: list[str], line: int) -> int:
    """The first line of the comments and decorators right above a definition's line."""
    start = line
    while start > 1:
        above = lines[start - 2].strip() if start - 2 < len(lines) else ""
        if not above.startswith(("#", "@", "//", "///", "/*", "*")):
            break
        start -= 1
    return start
