"""Tab completion for the chat's input: slash command names, and file paths (under the
session's repository for a question, under the current folder for a command's argument)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

MAX_ENTRIES = 2000  # a folder's entries read at most (a huge folder must not stall a key)


@dataclass(slots=True)
class Completion:
    word: str  # the word before the cursor that was completed
    text: str  # what replaces it: the one match, or the matches' common start
    options: list[str] = field(default_factory=list)  # every match


def complete(before: str, commands: list[str], root: str | None) -> Completion | None:
    """Complete the last word of `before` (the text before the cursor); None when nothing
    matches. `root`: the folder a question's paths are under (None: no path completion)."""
    words = before.split()
    word = "" if not words or before[-1].isspace() else words[-1]
    if word.startswith("/") and len(words) == 1 and word == before.lstrip():
        return _pick(word, sorted(c for c in commands if c.startswith(word)), " ")
    if words and words[0] in commands:  # a command's argument: a path from here
        folder = Path(os.path.expanduser(os.path.dirname(word) or "."))
    elif root is None or not word or word.startswith(("/", "~")) or ".." in word.split("/"):
        return None  # a question's paths stay under the root
    else:
        folder = Path(root) / os.path.dirname(word)
    head, prefix = word[: len(word) - len(os.path.basename(word))], os.path.basename(word)
    return _pick(word, [head + name for name in _entries(folder, prefix)], " ")


def _entries(folder: Path, prefix: str) -> list[str]:
    """Names in `folder` that start with `prefix`, a folder's with "/" after it; hidden ones
    only when `prefix` starts with a dot."""
    names = []
    try:
        with os.scandir(folder) as it:
            for i, entry in enumerate(it):
                if i >= MAX_ENTRIES:
                    break
                name = entry.name
                if not name.startswith(prefix) or (name[0] == "." and prefix[:1] != "."):
                    continue
                names.append(name + "/" if _is_dir(entry) else name)
    except (OSError, ValueError):  # no such folder, no access, a NUL in the name
        return []
    return sorted(names)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _pick(word: str, matches: list[str], after: str) -> Completion | None:
    if not matches:
        return None
    if len(matches) == 1:
        one = matches[0]
        return Completion(word, one if one.endswith("/") else one + after, matches)
    return Completion(word, os.path.commonprefix(matches), matches)
