"""A real library as a test repository: a standard-library package copied into a git
repository with one commit (nothing written for this project)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import git

AUTHOR = git.Actor("Test", "test@example.com")


def stdlib_repo(package: str, parent: Path) -> Path:
    """parent/<package>-repo/<package>/... committed; returns the repository's root."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    source = Path(list(spec.submodule_search_locations)[0])
    root = parent / f"{package}-repo"
    shutil.copytree(source, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    with git.Repo.init(root) as repo:
        repo.git.add("-A")
        repo.index.commit(f"{package} from the standard library", author=AUTHOR, committer=AUTHOR)
    return root
