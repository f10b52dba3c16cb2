"""Search the repository's text files with a Python regular expression."""

from __future__ import annotations

import os
import re

import pathspec

from tools.errors import ToolError
from tools.read_file import split_lines
from tools.regex_guard import GuardedPattern, compile_guarded
from tools.repo_files import list_files, read_text, resolve_root

# Long enough to show the match in context, short enough that 200 hits stay readable.
MATCH_LINE_CHARS = 200
# A path is at most 4096 bytes; no glob for one is longer.
MAX_GLOB_CHARS = 1000


def grep(
    root: str | os.PathLike[str],
    pattern: str,
    path_glob: str | None = None,
    ignore_case: bool = False,
    max_matches: int = 200,
) -> str:
    regex = compile_pattern(pattern, ignore_case)
    if max_matches < 1:
        raise ToolError(f"max_matches must be 1 or more, got {max_matches}")
    base = resolve_root(root)
    paths = list_files(base)
    if path_glob:
        glob = compile_glob(path_glob)
        paths = [path for path in paths if glob is not None and glob.match(path)]

    shown: list[str] = []
    found = skipped = 0
    for path in paths:
        try:
            text = read_text(base, path)
        except ToolError:
            skipped += 1  # binary, too large or unreadable: not worth a line each
            continue
        for number, line in enumerate(split_lines(text), 1):
            match = regex.search(line)
            if match is None:
                continue
            found += 1
            if found <= max_matches:
                shown.append(f"{path}:{number}: {clip_around(line, match.start())}")

    where = f"{len(paths)} files" + (f" matching {path_glob!r}" if path_glob else "")
    if not shown:
        shown.append(f"no matches for {pattern!r} in {where}")
    if found > max_matches:
        shown.append(f"... {found - max_matches} more matches")
    if skipped:
        shown.append(f"({skipped} binary, too large or unreadable files skipped)")
    return "\n".join(shown)


def compile_pattern(pattern: str, ignore_case: bool) -> GuardedPattern:
    """The pattern, matched within a time budget: `error: pattern too slow` past it."""
    return compile_guarded(pattern, ignore_case)


def compile_glob(path_glob: str) -> GuardedPattern | None:
    """git's wildcard rules ("*.py" matches at any depth, "src/" a whole directory), as a
    guarded pattern: '*' * 200 + 'x' backtracks as badly as any regex. None where the glob
    matches nothing (a comment, a "!negation")."""
    if len(path_glob) > MAX_GLOB_CHARS:
        raise ToolError(
            f"path_glob too long: {len(path_glob):,} characters, limit {MAX_GLOB_CHARS}"
        )
    try:
        spec = pathspec.GitIgnoreSpec.from_lines([path_glob])
    except (ValueError, re.error):  # "[z-a]", a lone "!" or "\"
        raise ToolError(f"invalid path_glob {path_glob!r}") from None
    # one pattern: a path is in when that pattern matches and includes (not "!...")
    found = [p for p in spec.patterns if p.include and p.regex is not None]
    if not found:
        return None
    # pathspec writes a glob's regex, some 4 characters for each of the glob's
    return compile_guarded(found[0].regex.pattern, max_chars=8 * MAX_GLOB_CHARS)


def clip_around(line: str, at: int, limit: int = MATCH_LINE_CHARS) -> str:
    """The line cut to limit chars, keeping the match at `at` in view."""
    stripped = line.lstrip()
    at -= len(line) - len(stripped)  # indentation is noise in a match listing
    line = stripped.rstrip()
    if len(line) <= limit:
        return line
    begin = max(0, min(at - limit // 4, len(line) - limit))
    head = "…" if begin else ""
    tail = "…" if begin + limit < len(line) else ""
    return f"{head}{line[begin : begin + limit]}{tail}"
