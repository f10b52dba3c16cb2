"""Pack a repository into one prompt context under a token budget.

First a map of the whole repository (agentctx.repo_map): every file's path and size, and the
outline of the code. The map depends only on the repository and its budget, so it is the
same prefix for every question. Then the files most relevant to the question
(agentctx.ranking), whole while they fit, rendered with line numbers so an answer can cite
path:line; a relevant file too big for the room left gets its head, and the rest are in the
map only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentctx.code_outline import inner_functions, outline_symbols
from agentctx.context_choice import CHOICE, REASON_DROPPED
from agentctx.excerpts import Excerpt, best_excerpts
from agentctx.ranking import is_boilerplate, is_overview, rank_paths
from agentctx.ranking import relevance as _relevance
from agentctx.repo_map import MapEntry, RepoMap, build_map
from tools.errors import BinaryFileError, FileTooLargeError, RootError, ToolError
from tools.names import printable
from tools.repo_files import confine, head_commit, list_files, read_text, resolve_root

REASON_BUDGET = "budget"  # did not fit: in the map only
REASON_TRUNCATED = "truncated"
REASON_BINARY = "binary"
REASON_TOO_LARGE = "too large"
REASON_UNREADABLE = "unreadable"

# The map's share of the budget when the caller gives it none; what it does not use goes
# to the files.
MAP_SHARE = 0.5
# The budget of a question about the project as a whole ("What does this repository do?"):
# the README, the design docs and a map of every file answer it, and more context only
# distracts a small model. Qwen2.5-Coder-0.5B asked that question of this repository at two
# of its commits answered "This repository does not do anything." with all 26K tokens that
# fit its window, and correctly within 16K or 10K (and at a third commit, in all three).
OVERVIEW_TOKENS = 16_384
# Truncating a file to fewer lines than this shows too little to be worth the tokens.
MIN_TRUNCATED_LINES = 20
# Only files this high in the ranking get a truncated head when they do not fit whole, and
# at most this many of them, each at most a share of the files' room.
TRUNCATION_RANKS = 8
TRUNCATION_CANDIDATES = 3
FIRST_TRUNCATED_SHARE, TRUNCATED_SHARE = 2 / 3, 1 / 3
# Each attempt costs a count_tokens call; the estimate converges in one or two.
TRUNCATION_ATTEMPTS = 4


@dataclass(slots=True)
class PackedFile:
    path: str
    tokens: int
    packed: str = "full"  # "full", or "truncated" (its head)
    lines: int | None = None  # lines shown
    total_lines: int | None = None


@dataclass(slots=True)
class OmittedFile:
    path: str
    tokens: int | None  # tokens left out; None where the file was never rendered
    reason: str  # "budget", "truncated", "binary", "too large", "unreadable"
    map: str = ""  # how the map shows it: "outline", "path" (and size), "" (not named)


@dataclass(slots=True)
class MapSummary:
    tokens: int
    files: int  # files in the repository
    listed: int  # files the map names
    detail: str
    notes: list[str]


@dataclass(slots=True)
class PackedContext:
    text: str
    files: list[PackedFile]  # in the order they appear in text
    omitted: list[OmittedFile]  # a truncated file is in both lists
    tokens: int  # tokens of text
    commit: str | None  # HEAD sha if a git repository with commits
    map: MapSummary | None = None
    budget: int | None = None
    warnings: list[str] = field(default_factory=list)
    # definitions shown again after the files, right before the question (agentctx.excerpts)
    excerpts: list[Excerpt] = field(default_factory=list)

    @property
    def tokens_omitted(self) -> int:
        return sum(item.tokens for item in self.omitted if item.tokens is not None)


@dataclass(slots=True)
class _Rendering:
    path: str
    text: str
    tokens: int
    shown: int
    total: int


def pack_repository(
    root: str | os.PathLike[str],
    question: str,
    count_tokens: Callable[[str], int],
    budget_tokens: int,
    max_file_bytes: int = 200_000,
    map_budget: int | None = None,
    cap_overview: bool = False,
) -> PackedContext:
    """The map (within map_budget, default MAP_SHARE of the budget), then the files.
    cap_overview: a question about the project as a whole (ranking's is_overview) gets at
    most OVERVIEW_TOKENS."""
    base = resolve_root(root)
    texts, unread = _read_all(base, max_file_bytes)
    if not texts:
        raise RootError(f"repository has no text files: {printable(str(base))}")
    lines_of = {path: _split_lines(text) for path, text in texts.items()}
    symbols = {path: outline_symbols(path, text) for path, text in texts.items()}
    entries = [
        MapEntry(path, len(lines_of[path]), len(texts[path].encode("utf-8", "surrogatepass")),
                 symbols[path])
        for path in texts
    ] + [MapEntry(path, None, size) for path, (_, size) in unread.items()]  # fmt: skip
    budget = max(budget_tokens, 0)
    limit = int(budget * MAP_SHARE) if map_budget is None else map_budget
    project = _project_names(base, texts)
    notes = []
    if cap_overview and budget > OVERVIEW_TOKENS and is_overview(question, project):
        budget, limit = OVERVIEW_TOKENS, min(limit, int(OVERVIEW_TOKENS * MAP_SHARE))
        notes.append(f"a question about the whole project gets {budget:,} tokens "
                     "(--context-tokens N gives it more)")  # fmt: skip
    repo_map = build_map(entries, max(min(limit, budget - 1), 0), count_tokens)
    names = {path: [s.name for s in found] for path, found in symbols.items()}
    ranked = rank_paths(texts, question, names, project)
    choice = CHOICE.get()  # /add and /drop in the TUI
    dropped = [p for p in (choice.dropped if choice else []) if p in texts]
    if choice is not None:
        ranked = choice.ranked(ranked)
    kept = [p for p in lines_of if p not in dropped]  # (no definition of a dropped file)
    prefix = repo_map.text + "\n" if repo_map.text else ""
    section, excerpts = best_excerpts(
        {p: lines_of[p] for p in kept},
        {p: symbols[p] + inner_functions(p, texts[p]) for p in kept if symbols[p]},
        question, count_tokens, budget - repo_map.tokens, project,
    )  # fmt: skip
    suffix = "\n" + section if section else ""
    room = budget - repo_map.tokens - (count_tokens(suffix) if suffix else 0)
    chosen, full_tokens = _choose(ranked, texts, lines_of, room, count_tokens)
    text, tokens = _join_within_budget(prefix, chosen, suffix, budget, count_tokens)
    if not suffix or not text.endswith(suffix):
        excerpts = []
    files = [
        PackedFile(
            r.path, r.tokens, "full" if r.shown == r.total else "truncated", r.shown, r.total
        )
        for r in (chosen[rank] for rank in sorted(chosen))
    ]
    summary = MapSummary(repo_map.tokens, repo_map.files, repo_map.listed, repo_map.detail,
                         [*repo_map.notes, *notes])  # fmt: skip
    omitted = _omitted(repo_map, ranked, chosen, full_tokens, unread)
    omitted += [OmittedFile(p, count_tokens(render_file(p, _split_lines(texts[p]))),
                            REASON_DROPPED, repo_map.shown.get(p, "")) for p in dropped]  # fmt: skip
    return PackedContext(
        text, files, omitted, tokens, head_commit(base), summary, budget,
        _warnings(repo_map, files, budget), excerpts,
    )  # fmt: skip


def _read_all(base: Path, max_file_bytes: int) -> tuple[dict[str, str], dict]:
    texts: dict[str, str] = {}
    unread: dict[str, tuple[str, int]] = {}  # path -> (reason, size in bytes)
    # list_files gives names in show_path's form: printable, whatever bytes a name has
    # on disk, so they can go into the text, and read_text takes them back
    for path in list_files(base):
        try:
            texts[path] = read_text(base, path, max_bytes=max_file_bytes)
            continue
        except BinaryFileError:
            reason = REASON_BINARY
        except FileTooLargeError:
            reason = REASON_TOO_LARGE
        except ToolError:
            reason = REASON_UNREADABLE
        try:
            size = confine(base, path).stat().st_size
        except (OSError, ToolError):
            size = 0
        unread[path] = (reason, size)
    return texts, unread


def _choose(ranked, texts, lines_of, room, count_tokens):
    """rank -> rendering of the files packed, whole while they fit, then heads of the best
    that do not; and every file's full token count."""
    chosen: dict[int, _Rendering] = {}
    full_tokens: list[int] = []
    used, truncations = 0, 0
    for rank, path in enumerate(ranked):
        lines = lines_of[path]
        rendering = render_file(path, lines)
        tokens = count_tokens(rendering)
        full_tokens.append(tokens)
        if used + tokens <= room:
            chosen[rank] = _Rendering(path, rendering, tokens, len(lines), len(lines))
            used += tokens
        elif (
            rank < TRUNCATION_RANKS
            and truncations < TRUNCATION_CANDIDATES
            and not is_boilerplate(path, texts[path])
        ):
            # the best file may take a bigger share of the room than the others
            limit = FIRST_TRUNCATED_SHARE if rank == 0 else TRUNCATED_SHARE
            share = min(room - used, int(room * limit))
            head = _truncate_to_fit(path, lines, tokens, share, count_tokens)
            if head is not None:
                chosen[rank] = head
                used += head.tokens
                truncations += 1
    return chosen, full_tokens


def _omitted(repo_map: RepoMap, ranked, chosen, full_tokens, unread) -> list[OmittedFile]:
    """The files left out or cut, with how the map shows each."""
    omitted: list[OmittedFile] = []
    for rank, path in enumerate(ranked):
        how = repo_map.shown.get(path, "")
        if rank not in chosen:
            omitted.append(OmittedFile(path, full_tokens[rank], REASON_BUDGET, how))
        elif chosen[rank].shown < chosen[rank].total:
            left_out = max(full_tokens[rank] - chosen[rank].tokens, 0)
            omitted.append(OmittedFile(path, left_out, REASON_TRUNCATED, how))
    for path, (reason, _) in unread.items():
        omitted.append(OmittedFile(path, None, reason, repo_map.shown.get(path, "")))
    return omitted


def _warnings(repo_map: RepoMap, files: list[PackedFile], budget: int) -> list[str]:
    warnings = []
    if not files:
        warnings.append(
            f"no file fits in full in the {budget:,}-token budget"
            + (" after the repository map" if repo_map.tokens else "")
        )
    if repo_map.listed < repo_map.files:
        warnings.append(
            f"the repository map names only {repo_map.listed:,} of {repo_map.files:,} files"
        )
    return warnings


def _project_names(base: Path, texts: dict[str, str]) -> frozenset[str]:
    """The names a question may call the project by: its directory, its top-level packages."""
    names = {base.name}
    for path in texts:
        head, _, rest = path.partition("/")
        if rest == "__init__.py" or rest in ("package.json", "Cargo.toml", "go.mod"):
            names.add(head)
    return frozenset(names)


def relevance(texts: dict[str, str], question: str) -> dict[str, float]:
    """BM25 score of each text for the question (0 when nothing matches)."""
    return _relevance(texts, question)


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


def summary_line(packed: PackedContext, noun: str = "file") -> str:
    """E.g. "packed 12 files (3,456 tokens, 1 truncated) and a map of all 405 files (5,678
    tokens); 392 files only in the map (98,765 tokens)"."""
    truncated = sum(1 for item in packed.files if item.packed == "truncated")
    if packed.map is None:  # a book: chapters, no map
        truncated = truncated or sum(1 for o in packed.omitted if o.reason == REASON_TRUNCATED)
        left_out = len(packed.omitted) - truncated
        line = f"packed {_count(len(packed.files), noun)} ({packed.tokens:,} tokens"
        line += f", {truncated} truncated)" if truncated else ")"
        if left_out:
            # tokens left out include the cut tails of truncated chapters
            line += f"; left out {_count(left_out, noun)} ({packed.tokens_omitted:,} tokens)"
        return line
    m = packed.map
    in_files = sum(item.tokens for item in packed.files)
    line = f"packed {_count(len(packed.files), noun)} ({in_files:,} tokens"
    line += f", {truncated} truncated)" if truncated else ")"
    which = f"all {m.files:,}" if m.listed == m.files else f"{m.listed:,} of {m.files:,}"
    line += f" and a map of {which} {_plural(noun, m.files)} ({m.tokens:,} tokens)"
    if packed.excerpts:
        again = sum(e.tokens for e in packed.excerpts)
        line += f", {_count(len(packed.excerpts), 'definition')} again ({again:,} tokens)"
    only_map = [o for o in packed.omitted if o.reason != REASON_TRUNCATED]
    if only_map:
        tokens = sum(o.tokens or 0 for o in only_map)
        line += f"; {_count(len(only_map), noun)} only in the map ({tokens:,} tokens)"
    return line


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
            return _Rendering(path, rendering, tokens, shown, len(lines))
        shown = min(shown - 1, int(shown * room / tokens * 0.95))
    return None


def _join_within_budget(
    prefix: str,
    chosen: dict[int, _Rendering],
    suffix: str,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
) -> tuple[str, int]:
    """The packed text (prefix, the files, then suffix) and its true token count, dropping
    files from the end if the whole overshoots, and then the suffix.

    Counted one by one the parts fit; a tokenizer can still merge across the seams between
    them, so the joined text is counted once more and trimmed from the end.
    """
    while True:
        text = prefix + "".join(chosen[rank].text for rank in sorted(chosen)) + suffix
        tokens = count_tokens(text) if text else 0
        if tokens <= budget_tokens:
            return text, tokens
        if chosen:
            del chosen[max(chosen)]
        elif suffix:
            suffix = ""
        else:
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
