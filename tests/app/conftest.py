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


@pytest.fixture
def anyio_backend():
    """The TUI's and the server's async tests run on asyncio (Textual's loop)."""
    return "asyncio"


@pytest.fixture
def store(tmp_path):
    """An empty session store: a real SQLite file in the test's folder."""
    from sessions.store import SessionStore

    with SessionStore(tmp_path / "sessions.db") as s:
        yield s


@pytest.fixture(scope="module")
def tokenizer(agentctx_home):
    """The default model's tokenizer (loaded once per module), for the scripted engines."""
    from transformers import AutoTokenizer

    from engine.loading.loader import resolve_source

    return AutoTokenizer.from_pretrained(resolve_source(None).path)
