"""Store folders for the reliability tests: a session of every record kind (turns, a tool
call, a manifest), the state of a folder byte for byte, and a private AGENTCTX_HOME."""

from __future__ import annotations

import os
from pathlib import Path

from sessions.store import SessionStore


def fill_store(store: SessionStore, root: str = "/r") -> str:
    """A session with two turns, a tool call and a manifest; returns its id."""
    s = store.create(root, "repo", "smollm2-135m", name="greeter")
    store.add_message(s.id, "user", "What does greet() do?")
    a = store.add_message(s.id, "assistant", "It greets — «bonjour» ✓.", tokens=9,
                          timings={"ttft_s": 0.25, "decode_tok_s": 41.5})  # fmt: skip
    store.add_tool_call(s.id, "read_file", {"path": "greet.py"}, "def greet(): ...", None,
                        message_id=a.id)  # fmt: skip
    store.add_manifest(s.id, [{"path": "greet.py", "tokens": 12}],
                       [{"path": "logo.png", "tokens": None, "reason": "binary"}],
                       message_id=a.id)  # fmt: skip
    store.add_message(s.id, "user", "And where is it called?")
    store.add_message(s.id, "assistant", "In main.py.", status="interrupted")
    return s.id


def folder_state(home: Path) -> dict[str, bytes | None]:
    """Every file under `home` with its bytes (None for a folder), but SQLite's shared
    memory index (-shm), which any reader rewrites. A refused import must leave this
    exactly as it was."""
    state: dict[str, bytes | None] = {}
    for p in sorted(home.rglob("*")):
        rel = str(p.relative_to(home))
        if rel.endswith("-shm") or p.is_symlink():
            continue
        state[rel] = p.read_bytes() if p.is_file() else None
    return state


def private_home(tmp_path: Path) -> Path:
    """A fresh AGENTCTX_HOME folder with the suite's config.json (its default model,
    SmolLM2) and a link to its model cache (converted once per run)."""
    shared = Path(os.environ["AGENTCTX_HOME"])
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text((shared / "config.json").read_text())
    (shared / "cache").mkdir(exist_ok=True)
    (home / "cache").symlink_to(shared / "cache")
    return home
