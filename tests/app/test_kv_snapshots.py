"""The app's snapshot folder: sizes, the budget and LRU pruning (real files)."""

from __future__ import annotations

import os

import pytest

from agentctx import kv_snapshots
from agentctx.kv_snapshots import BudgetError, parse_size, prune
from sessions.errors import StoreError


@pytest.mark.parametrize("text,size", [
    ("4GiB", 4 << 30), ("500MB", 500_000_000), ("1.5 kib", 1536), ("0", 0), (123, 123),
])  # fmt: skip
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["lots", "4 parsecs", "-1GB", -5, ""])
def test_bad_sizes(bad):
    with pytest.raises(BudgetError):
        parse_size(bad)


def test_prune_drops_least_recently_used_first(tmp_path):
    for i, name in enumerate(["old", "mid", "new"]):
        p = tmp_path / f"{name}.kv"
        p.write_bytes(b"x" * 100)
        os.utime(p, (1000 + i, 1000 + i))
    os.utime(tmp_path / "old.kv", (2000, 2000))  # used (loaded) most recently
    (tmp_path / "notes.txt").write_text("not a snapshot")
    removed = prune(tmp_path, 200)
    assert [p.name for p in removed] == ["mid.kv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.kv", "notes.txt", "old.kv"]
    assert [p.name for p in prune(tmp_path, 50)] == ["new.kv", "old.kv"]


def test_budget_from_env_and_config(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path))
    monkeypatch.delenv("AGENTCTX_KV_BUDGET", raising=False)
    assert kv_snapshots.budget() == kv_snapshots.DEFAULT_BUDGET
    (tmp_path / "config.json").write_text('{"kv_budget": "2GB"}')
    assert kv_snapshots.budget() == 2_000_000_000
    monkeypatch.setenv("AGENTCTX_KV_BUDGET", "1MiB")
    assert kv_snapshots.budget() == 1 << 20
    assert kv_snapshots.kv_path("s-abc123") == tmp_path / "kv" / "s-abc123.kv"
    with pytest.raises(StoreError, match="not of the form"):  # it would name ../escaped.kv
        kv_snapshots.kv_path("../escaped")
