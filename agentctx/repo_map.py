"""A map of the whole repository, packed ahead of the files: every file's path and size, and
for code its classes and functions with their lines (the role aider's repo map plays).

The map depends only on the repository and its token budget, never on the question, so it
is the same prefix of every first prompt over one repository and a second question reuses
its KV. When the full map is over its budget it is shrunk step by step, each step named in
its notes (the packing report shows them): a test file's functions are counted instead of
named, then private methods, all methods, private functions, line numbers and the outlines
go; then the biggest directories collapse into one line each; last, the list is cut. It
never overflows its budget.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from agentctx.code_outline import Symbol

MAP_TITLE = "Repository map"
# Files with no outline share a line per directory, this many to a line (a cut keeps lines).
GROUP_ENTRIES = 10
COLLAPSE_MIN_SHARE = 0.5  # collapse the deepest directory holding this share of the biggest


@dataclass(slots=True)
class MapEntry:
    path: str
    lines: int | None  # None: not read as text (binary, too large, unreadable)
    size: int  # bytes
    symbols: list[Symbol] = field(default_factory=list)


@dataclass(slots=True)
class RepoMap:
    text: str
    tokens: int
    files: int  # files in the repository
    detail: str  # what each entry shows, as the header says
    notes: list[str]  # what was left out to fit the budget
    shown: dict[str, str]  # path -> "outline", "path" (path and size only) or "" (not named)

    @property
    def listed(self) -> int:
        return sum(1 for how in self.shown.values() if how)


@dataclass(frozen=True, slots=True)
class _Level:
    tests: bool  # name each function of a test file (else count them)
    members: str  # "all", "public" or "none"
    private: bool  # top-level names starting with "_"
    numbers: bool
    outlines: bool
    note: str  # what this level leaves out, for the report


_LEVELS = (
    _Level(True, "all", True, True, True, ""),
    _Level(False, "all", True, True, True, "test functions counted, not named"),
    _Level(False, "public", True, True, True, "private methods left out"),
    _Level(False, "none", True, True, True, "methods left out"),
    _Level(False, "none", False, True, True, "private functions left out"),
    _Level(False, "none", False, False, True, "line numbers left out"),
    _Level(False, "none", False, False, False, "outlines left out"),
)
_TEST_FILE = re.compile(
    r"(?:^|/)(?:tests?/|test_[^/]*$|[^/]*_test\.\w+$|[^/]*\.(?:test|spec)\.\w+$)"
)
_TEST_NAME = re.compile(r"^(?:test|Test)")


def build_map(
    entries: list[MapEntry], budget_tokens: int, count_tokens: Callable[[str], int]
) -> RepoMap:
    """The most detailed map of the entries that fits in budget_tokens."""
    entries = sorted(entries, key=lambda e: (PurePosixPath(e.path).parent.parts, e.path))
    for level in _LEVELS:
        text, shown = _render(entries, level, set())
        tokens = count_tokens(text)
        if tokens <= budget_tokens:
            return _result(entries, level, text, tokens, shown, set(), 0)
    level = _LEVELS[-1]
    collapsed: set[str] = set()
    while True:
        more = _collapse_more(entries, collapsed, tokens / max(len(text), 1), len(text),
                              budget_tokens)  # fmt: skip
        if not more:
            break
        collapsed |= more
        text, shown = _render(entries, level, collapsed)
        tokens = count_tokens(text)
        if tokens <= budget_tokens:
            return _result(entries, level, text, tokens, shown, collapsed, 0)
    return _cut(entries, level, collapsed, budget_tokens, count_tokens)


def _result(entries, level, text, tokens, shown, collapsed, cut) -> RepoMap:
    notes = [lv.note for lv in _LEVELS[1 : _LEVELS.index(level) + 1]]
    counts = _files_under(entries)
    notes += [f"{d}/ collapsed ({counts[d]:,} files)" for d in sorted(collapsed)]
    if cut:
        notes.append(f"{cut:,} files not listed (no room)")
    return RepoMap(text, tokens, len(entries), _detail(level), notes, shown)


def _detail(level: _Level) -> str:
    """What the entries show: the header says it, in words that do not change with each
    step of shrinking (a longer header would eat what the step saves)."""
    if not level.outlines:
        return "line counts (sizes for other files)"
    if not level.numbers:
        return "line counts, and the classes and functions of code files"
    return "line counts, and the classes and functions of code files as name:line"


def _render(entries: list[MapEntry], level: _Level, collapsed: set[str]) -> tuple[str, dict]:
    lines, shown, _ = _render_lines(entries, level, collapsed)
    return "\n".join(lines) + "\n", shown


def _render_lines(
    entries: list[MapEntry], level: _Level, collapsed: set[str]
) -> tuple[list[str], dict[str, str], dict[str, int]]:
    """The map's lines (a header first), how each file is shown, and each file's line."""
    lines = [_header(len(entries), level)]
    shown: dict[str, str] = {}
    line_of: dict[str, int] = {}
    group: list[str] = []
    group_dir: str | None = None
    done_dirs: dict[str, int] = {}

    def flush() -> None:
        if group:
            prefix = f"{group_dir}/: " if group_dir else ""
            lines.append(prefix + ", ".join(group))
            group.clear()

    for entry in entries:
        parent = _parent(entry.path)
        hidden = _collapsed_ancestor(parent, collapsed)
        if hidden is not None:
            if hidden not in done_dirs:
                flush()
                lines.append(_collapsed_line(hidden, entries))
                done_dirs[hidden] = len(lines) - 1
            shown[entry.path], line_of[entry.path] = "", done_dirs[hidden]
            continue
        if not level.outlines:
            outline = ""
        elif not level.tests and _TEST_FILE.search(entry.path):
            outline = _test_summary(entry.symbols)
        else:
            outline = _outline_text(entry.symbols, level)
        if outline:
            flush()
            lines.append(f"{entry.path} ({_size(entry)}): {outline}")
            shown[entry.path], line_of[entry.path] = "outline", len(lines) - 1
            continue
        if group and (group_dir != parent or len(group) >= GROUP_ENTRIES):
            flush()
        group_dir = parent
        group.append(f"{PurePosixPath(entry.path).name} ({_size(entry)})")
        shown[entry.path], line_of[entry.path] = "path", len(lines)  # the line flush() adds
    flush()
    return lines, shown, line_of


def _header(files: int, level: _Level) -> str:
    return f"=== {MAP_TITLE}: {files:,} files, with {_detail(level)} ==="


def _test_summary(symbols: list[Symbol]) -> str:
    tests = sum(1 for s in symbols if _TEST_NAME.match(s.name) and s.kind == "def")
    others = sum(1 for s in symbols if s.depth == 0) - sum(
        1 for s in symbols if s.depth == 0 and _TEST_NAME.match(s.name) and s.kind == "def"
    )
    parts = [f"{tests} tests"] if tests else []
    if others:
        parts.append(f"{others} other definitions")
    return ", ".join(parts)


def _outline_text(symbols: list[Symbol], level: _Level) -> str:
    parts: list[str] = []
    members: list[str] = []

    def close() -> None:
        if members and parts:
            parts[-1] += f" ({', '.join(members)})"
        members.clear()

    for symbol in symbols:
        private = symbol.name.startswith("_") and not symbol.name.startswith("__")
        label = f"{symbol.name}:{symbol.line}" if level.numbers else symbol.name
        if symbol.depth == 0:
            close()
            if private and not level.private:
                parts.append("")  # a placeholder, so its members are dropped with it
                continue
            parts.append(f"class {label}" if symbol.kind == "class" else label)
        elif parts and parts[-1] and (level.members == "all" or
                                      level.members == "public" and not private):  # fmt: skip
            if symbol.name.startswith("__") and level.members != "all":
                continue  # dunder methods say little once space is short
            members.append(label)
    close()
    return "; ".join(part for part in parts if part)


def _size(entry: MapEntry) -> str:
    if entry.lines is not None:
        return f"{entry.lines:,} line" + ("" if entry.lines == 1 else "s")
    return _bytes(entry.size)


def _bytes(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.0f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def _collapsed_ancestor(parent: str, collapsed: set[str]) -> str | None:
    if not collapsed or not parent:
        return None
    parts = parent.split("/")
    for end in range(1, len(parts) + 1):
        candidate = "/".join(parts[:end])
        if candidate in collapsed:
            return candidate
    return None


def _collapsed_line(directory: str, entries: list[MapEntry]) -> str:
    inside = [e for e in entries if e.path.startswith(directory + "/")]
    size = sum(e.size for e in inside)
    return f"{directory}/: {len(inside):,} files, {_bytes(size)} (not listed)"


def _files_under(entries: list[MapEntry]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for entry in entries:
        parts = PurePosixPath(entry.path).parts[:-1]
        for end in range(1, len(parts) + 1):
            counts["/".join(parts[:end])] += 1
    return counts


def _collapse_more(
    entries: list[MapEntry], collapsed: set[str], ratio: float, chars: int, budget: int
) -> set[str]:
    """Directories to collapse next, enough that the map's estimated tokens fit."""
    listed = [e for e in entries if _collapsed_ancestor(_parent(e.path), collapsed) is None]
    counts = _files_under(listed)
    for directory in list(counts):
        if _collapsed_ancestor(directory, collapsed) is not None:
            del counts[directory]
    chosen: set[str] = set()
    need = chars - budget / max(ratio, 1e-9)  # characters to save
    while counts and need > 0:
        biggest = max(counts.values())
        # the deepest directory with at least half the biggest count: docs/runs/ before docs/
        directory = max(
            (d for d, n in counts.items() if n >= biggest * COLLAPSE_MIN_SHARE),
            key=lambda d: (d.count("/"), counts[d], d),
        )
        chosen.add(directory)
        inside = [e for e in listed if e.path.startswith(directory + "/")]
        need -= sum(len(e.path) + 12 for e in inside) - len(directory) - 30
        for other in list(counts):
            if other == directory or other.startswith(directory + "/"):
                del counts[other]
            elif directory.startswith(other + "/"):
                counts[other] -= len(inside) - 1  # the collapsed line is one entry left
    return chosen


def _parent(path: str) -> str:
    parent = PurePosixPath(path).parent.as_posix()
    return "" if parent == "." else parent


def _cut(entries, level, collapsed, budget, count_tokens) -> RepoMap:
    """The map's first lines that fit, then a line saying how many files it does not name."""
    lines, shown, line_of = _render_lines(entries, level, collapsed)

    def attempt(kept: int) -> tuple[str, int]:
        left = sum(1 for line in line_of.values() if line > kept)
        candidate = "\n".join(lines[: kept + 1] + [f"... {left:,} more files not listed"])
        return candidate + "\n", left

    low, high, best = 0, len(lines) - 1, None
    while low <= high:  # the most lines kept (after the header) that fit
        middle = (low + high) // 2
        candidate, left = attempt(middle)
        tokens = count_tokens(candidate)
        if tokens <= budget:
            best, low = (candidate, tokens, left, middle), middle + 1
        else:
            high = middle - 1
    if best is None:
        return RepoMap(
            "", 0, len(entries), "nothing", ["no room for a map"], dict.fromkeys(shown, "")
        )
    text, tokens, left, kept = best
    kept_shown = {path: how if line_of[path] <= kept else "" for path, how in shown.items()}
    still = {d for d in collapsed if any(line_of[e.path] <= kept for e in entries
                                         if e.path.startswith(d + "/"))}  # fmt: skip
    return _result(entries, level, text, tokens, kept_shown, still, left)
