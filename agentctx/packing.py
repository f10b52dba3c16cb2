"""Pack a repository's text files into one prompt context under a token budget.

Files are rendered with line numbers so an answer can cite path:line, ordered so the
most useful ones come first (README, docs, entry points, then BM25 relevance to the
question), and included whole while they fit.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from tools.errors import BinaryFileError, FileTooLargeError, RootError, ToolError
from tools.names import printable
from tools.repo_files import head_commit, list_files, read_text, resolve_root

REASON_BUDGET = "budget"
REASON_TRUNCATED = "truncated"
REASON_BINARY = "binary"
REASON_TOO_LARGE = "too large"
REASON_UNREADABLE = "unreadable"

ENTRY_POINT_NAMES = frozenset(
    {
        "pyproject.toml",
        "setup.py",
        "package.json",
        "cargo.toml",
        "go.mod",
        "makefile",
        "__main__.py",
        "cli.py",
        "app.py",
        "lib.rs",
    }
)
ENTRY_POINT_STEMS = frozenset({"main", "index"})
DOC_SUFFIXES = frozenset({".md", ".rst", ".markdown", ".adoc"})
DOC_DIRS = frozenset({"docs", "doc"})
# Machine-written files: big, and rarely what a question is about, so they go last.
GENERATED_NAMES = frozenset(
    {
        "package-lock.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "poetry.lock",
        "uv.lock",
        "cargo.lock",
        "pipfile.lock",
        "composer.lock",
        "gemfile.lock",
        "go.sum",
    }
)
GENERATED_SUFFIXES = (".min.js", ".min.css", ".map", ".svg")

# Truncating a file to fewer lines than this shows too little to be worth the tokens.
MIN_TRUNCATED_LINES = 20
# Only the best-ranked files that did not fit are tried for a truncated head.
TRUNCATION_CANDIDATES = 3
# Each attempt costs a count_tokens call; the estimate converges in one or two.
TRUNCATION_ATTEMPTS = 4

# BM25's usual constants; path words count extra since a file's name says what it is about.
BM25_K1 = 1.2
BM25_B = 0.75
PATH_WEIGHT = 3
# camelCase and snake_case pieces: "parseHTTPHeader_v2" -> parse, HTTP, Header, v, 2
_WORD_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_WORD = re.compile(r"[A-Za-z0-9_]+")
# Question words that say nothing about which file matters.
_STOPWORD_TEXT = (
    "a an and are as at be by can do does for from how i in is it its me of on or "
    "the this that to what when where which who why with you your there here"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


@dataclass(slots=True)
class PackedFile:
    path: str
    tokens: int


@dataclass(slots=True)
class OmittedFile:
    path: str
    tokens: int | None  # tokens left out; None where the file was never rendered
    reason: str  # "budget", "truncated", "binary", "too large", "unreadable"


@dataclass(slots=True)
class PackedContext:
    text: str
    files: list[PackedFile]  # in the order they appear in text
    omitted: list[OmittedFile]  # a truncated file is in both lists
    tokens: int  # tokens of text
    commit: str | None  # HEAD sha if a git repository with commits

    @property
    def tokens_omitted(self) -> int:
        return sum(item.tokens for item in self.omitted if item.tokens is not None)


@dataclass(slots=True)
class _Rendering:
    path: str
    text: str
    tokens: int


def pack_repository(
    root: str | os.PathLike[str],
    question: str,
    count_tokens: Callable[[str], int],
    budget_tokens: int,
    max_file_bytes: int = 200_000,
) -> PackedContext:
    base = resolve_root(root)
    omitted: list[OmittedFile] = []
    texts: dict[str, str] = {}
    # list_files gives names in show_path's form: printable, whatever bytes a name has
    # on disk, so they can go into the text, and read_text takes them back
    for path in list_files(base):
        try:
            texts[path] = read_text(base, path, max_bytes=max_file_bytes)
        except BinaryFileError:
            omitted.append(OmittedFile(path, None, REASON_BINARY))
        except FileTooLargeError:
            omitted.append(OmittedFile(path, None, REASON_TOO_LARGE))
        except ToolError:
            omitted.append(OmittedFile(path, None, REASON_UNREADABLE))
    if not texts:
        raise RootError(f"repository has no text files: {printable(str(base))}")

    ranked = rank_paths(texts, question)
    lines_of = {path: _split_lines(texts[path]) for path in ranked}
    full_tokens: list[int] = []
    chosen: dict[int, _Rendering] = {}  # rank -> rendering, so text keeps rank order
    used = 0
    for rank, path in enumerate(ranked):
        rendering = render_file(path, lines_of[path])
        tokens = count_tokens(rendering)
        full_tokens.append(tokens)
        if used + tokens <= budget_tokens:
            chosen[rank] = _Rendering(path, rendering, tokens)
            used += tokens

    # Leftover budget goes to the head of the best-ranked file that did not fit whole.
    truncated: set[int] = set()
    misfits = [rank for rank in range(len(ranked)) if rank not in chosen]
    for rank in misfits[:TRUNCATION_CANDIDATES]:
        path = ranked[rank]
        head = _truncate_to_fit(
            path, lines_of[path], full_tokens[rank], budget_tokens - used, count_tokens
        )
        if head is not None:
            chosen[rank] = head
            truncated.add(rank)
            used += head.tokens

    text, tokens = _join_within_budget(chosen, truncated, budget_tokens, count_tokens)
    for rank, path in enumerate(ranked):
        if rank not in chosen:
            omitted.append(OmittedFile(path, full_tokens[rank], REASON_BUDGET))
        elif rank in truncated:
            left_out = max(full_tokens[rank] - chosen[rank].tokens, 0)
            omitted.append(OmittedFile(path, left_out, REASON_TRUNCATED))
    files = [PackedFile(chosen[rank].path, chosen[rank].tokens) for rank in sorted(chosen)]
    return PackedContext(text, files, omitted, tokens, head_commit(base))


def summary_line(packed: PackedContext, noun: str = "file") -> str:
    """E.g. "packed 12 files (3,456 tokens); left out 4 files (9,876 tokens)"."""
    truncated = sum(1 for item in packed.omitted if item.reason == REASON_TRUNCATED)
    left_out = len(packed.omitted) - truncated
    line = f"packed {_count(len(packed.files), noun)} ({packed.tokens:,} tokens"
    line += f", {truncated} truncated)" if truncated else ")"
    if left_out:
        # tokens left out include the cut tails of truncated files
        line += f"; left out {_count(left_out, noun)} ({packed.tokens_omitted:,} tokens)"
    return line


def relevance(texts: dict[str, str], question: str) -> dict[str, float]:
    """BM25 score of each text for the question (0 when nothing matches)."""
    return _bm25_scores(texts, question)


def render_file(path: str, lines: list[str], shown: int | None = None) -> str:
    """A header then numbered lines, "  12| code"; with shown, only the first shown lines."""
    shown = len(lines) if shown is None else min(shown, len(lines))
    width = len(str(shown))
    out = [f"=== {path} ({len(lines)} {_plural('line', len(lines))}) ==="]
    for number, line in enumerate(lines[:shown], start=1):
        # no trailing space on empty lines: it is a token spent on nothing
        out.append(f"{number:>{width}}| {line}" if line else f"{number:>{width}}|")
    if shown < len(lines):
        out.append(f"... (truncated, {len(lines) - shown} more lines)")
    return "\n".join(out) + "\n"


def rank_paths(texts: dict[str, str], question: str) -> list[str]:
    """Paths in packing order: README, docs, entry points, the rest, generated files."""
    scores = _bm25_scores(texts, question)

    def order(path: str) -> tuple[int, int, float, str]:
        tier = _tier(path)
        # among entry points the shallow ones are the project's own, not a fixture's
        depth = path.count("/") if tier == 2 else 0
        return (tier, depth, -scores[path], path)

    return sorted(texts, key=order)


def _tier(path: str) -> int:
    pure = PurePosixPath(path)
    name = pure.name.lower()
    if len(pure.parts) == 1 and name.startswith("readme"):
        return 0
    if name in GENERATED_NAMES or name.endswith(GENERATED_SUFFIXES):
        return 4
    if pure.suffix.lower() in DOC_SUFFIXES or pure.parts[0].lower() in DOC_DIRS:
        return 1
    if name in ENTRY_POINT_NAMES or pure.stem.lower() in ENTRY_POINT_STEMS:
        return 2
    return 3


def _query_terms(question: str) -> set[str]:
    terms = _term_counts(question, with_compounds=True)
    return {term for term in terms if len(term) > 1 and not term.isdigit()} - _STOPWORDS


def _term_counts(text: str, with_compounds: bool) -> Counter[str]:
    """Lowercased identifier pieces, plus whole compound words so exact names match too."""
    counts: Counter[str] = Counter()
    # Counter over findall counts in C; lowercasing per distinct piece keeps big repos fast
    for piece, number in Counter(_WORD_PART.findall(text)).items():
        counts[piece.lower()] += number
    if with_compounds:
        for word, number in Counter(_WORD.findall(text)).items():
            tail = word[1:]
            # a compound has an inner underscore or a case change after its first letter
            if "_" in word.strip("_") or (tail != tail.lower() and not word.isupper()):
                counts[word.lower()] += number
    return counts


def _bm25_scores(texts: dict[str, str], question: str) -> dict[str, float]:
    query = _query_terms(question)
    if not query:
        return dict.fromkeys(texts, 0.0)
    # compounds only matter when the question names one, and cost a second pass over the text
    with_compounds = _term_counts(question, True).keys() != _term_counts(question, False).keys()
    lengths: dict[str, int] = {}
    matches: dict[str, Counter[str]] = {}
    for path, text in texts.items():
        terms = _term_counts(text, with_compounds)
        for term, number in _term_counts(path, with_compounds).items():
            terms[term] += PATH_WEIGHT * number
        lengths[path] = terms.total()
        # only query terms are kept: the rest matter only through the length
        matches[path] = Counter({term: terms[term] for term in query if term in terms})

    documents = len(texts)
    average_length = sum(lengths.values()) / documents or 1.0
    frequency = Counter(term for counts in matches.values() for term in counts)
    idf = {
        term: math.log(1 + (documents - frequency[term] + 0.5) / (frequency[term] + 0.5))
        for term in query
    }
    scores: dict[str, float] = {}
    for path, counts in matches.items():
        norm = BM25_K1 * (1 - BM25_B + BM25_B * lengths[path] / average_length)
        scores[path] = sum(
            idf[term] * count * (BM25_K1 + 1) / (count + norm) for term, count in counts.items()
        )
    return scores


def _truncate_to_fit(
    path: str,
    lines: list[str],
    full_tokens: int,
    room: int,
    count_tokens: Callable[[str], int],
) -> _Rendering | None:
    if room <= 0 or not lines:
        return None
    # start from the file's average line cost, then shrink by how far each try overshot
    shown = int(room * len(lines) / max(full_tokens, 1))
    for _ in range(TRUNCATION_ATTEMPTS):
        shown = min(shown, len(lines) - 1)
        if shown < MIN_TRUNCATED_LINES:
            return None
        rendering = render_file(path, lines, shown)
        tokens = count_tokens(rendering)
        if tokens <= room:
            return _Rendering(path, rendering, tokens)
        shown = min(shown - 1, int(shown * room / tokens * 0.95))
    return None


def _join_within_budget(
    chosen: dict[int, _Rendering],
    truncated: set[int],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
) -> tuple[str, int]:
    """The packed text and its true token count, dropping files if the whole overshoots.

    Counted one by one the renderings fit; a tokenizer can still merge across the seams
    between files, so the joined text is counted once more and trimmed from the end.
    """
    while chosen:
        text = "".join(chosen[rank].text for rank in sorted(chosen))
        tokens = count_tokens(text)
        if tokens <= budget_tokens:
            return text, tokens
        last = max(chosen)
        del chosen[last]
        truncated.discard(last)
    return "", 0


def _split_lines(text: str) -> list[str]:
    # only "\n" ends a line, as in git and editors; str.splitlines also splits on \f, \x1c...
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _count(number: int, noun: str) -> str:
    return f"{number:,} {_plural(noun, number)}"


def _plural(noun: str, number: int) -> str:
    return noun if number == 1 else f"{noun}s"
