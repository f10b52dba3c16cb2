"""Read a range of a text file as numbered lines, so the model can cite path:line."""

from __future__ import annotations

import os

from tools.errors import ToolError
from tools.names import printable
from tools.repo_files import read_text, resolve_root

# A minified bundle can be one megabyte on one line; the model needs only its start.
MAX_LINE_CHARS = 1000


def read_file(
    root: str | os.PathLike[str],
    path: str,
    start: int = 1,
    end: int | None = None,
    max_lines: int = 400,
) -> str:
    base = resolve_root(root)
    lines = split_lines(read_text(base, path))
    return format_range(printable(path), lines, start, end, max_lines)


def split_lines(text: str) -> list[str]:
    """Lines as an editor counts them: str.splitlines would also split on \\f and U+2028."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def check_range(label: str, total: int, start: int, end: int | None) -> int:
    """The last line to show (end clamped to the file), or a ToolError for a bad range."""
    if start < 1:
        raise ToolError(f"start must be 1 or more, got {start}")
    if end is not None and end < start:
        raise ToolError(f"end ({end}) is before start ({start})")
    if start > total:
        raise ToolError(f"start line {start} is past the end of {label} ({total} lines)")
    return total if end is None else min(end, total)


def format_range(label: str, lines: list[str], start: int, end: int | None, max_lines: int) -> str:
    """A header `label (lines a-b of N)` and the numbered lines, noting any truncation."""
    total = len(lines)
    if total == 0:
        return f"{label} (empty file)"
    if max_lines < 1:
        raise ToolError(f"max_lines must be 1 or more, got {max_lines}")
    last = check_range(label, total, start, end)
    shown_last = min(last, start + max_lines - 1)
    out = [f"{label} (lines {start}-{shown_last} of {total})"]
    out.extend(number_lines(lines[start - 1 : shown_last], start))
    if shown_last < last:
        out.append(f"... truncated at {max_lines} lines; read on with start={shown_last + 1}")
    return "\n".join(out)


def number_lines(lines: list[str], first: int) -> list[str]:
    width = max(4, len(str(first + len(lines) - 1)))
    return [f"{number:>{width}}| {clip(line)}" for number, line in enumerate(lines, first)]


def clip(line: str, limit: int = MAX_LINE_CHARS) -> str:
    if len(line) <= limit:
        return line
    return f"{line[:limit]}… [+{len(line) - limit} chars]"
