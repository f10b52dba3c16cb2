"""Helpers shared by the tool tests: real files and real git repositories in tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import git

AUTHOR = git.Actor("Ada Lovelace", "ada@example.com")
# Over read_text's 1 MB default, so every tool must refuse it rather than read it.
HUGE_TEXT = "x = 1\n" * 200_000


def write(root: Path, rel_path: str, content: str | bytes = "x\n") -> Path:
    path = root / rel_path
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def commit(repo: git.Repo, message: str, *paths: str) -> str:
    repo.index.add(list(paths))
    # a fixed date (2024-03-01 12:00 UTC) keeps blame and log output stable
    date = "1709294400 +0000"
    made = repo.index.commit(
        message, author=AUTHOR, committer=AUTHOR, author_date=date, commit_date=date
    )
    return made.hexsha


def init_repo(root: Path) -> git.Repo:
    root.mkdir(parents=True, exist_ok=True)
    return git.Repo.init(root)


def hostile_files(root: Path, outside: Path) -> None:
    """A binary file, invalid UTF-8, a huge file and a symlink out of root."""
    write(root, "blob.py", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    write(root, "latin.py", "caf\xe9 = 1\n".encode("latin-1"))
    write(root, "huge.py", HUGE_TEXT)
    write(outside, "secret.py", "TOKEN = 'secret'\n")
    os.symlink(outside / "secret.py", root / "leak.py")
