from __future__ import annotations

from pathlib import Path

import git
import pytest


@pytest.fixture
def repo(tmp_path) -> Path:
    """A tiny calculator library in a real git repository with one commit."""
    root = tmp_path / "calc"
    root.mkdir()
    r = git.Repo.init(root)
    (root / "README.md").write_text("# calc\n\nA tiny calculator library.\n")
    (root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    r.index.add(["README.md", "calc.py"])
    r.index.commit("initial")
    return root
