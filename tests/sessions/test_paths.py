from __future__ import annotations

from pathlib import Path

from sessions.paths import db_path, home_dir


def test_agentctx_home_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert home_dir() == tmp_path / "home"
    assert db_path() == tmp_path / "home" / "sessions.db"


def test_xdg_data_home(monkeypatch, tmp_path):
    monkeypatch.delenv("AGENTCTX_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert home_dir() == tmp_path / "xdg" / "agentctx"


def test_default(monkeypatch, tmp_path):
    monkeypatch.delenv("AGENTCTX_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert home_dir() == Path(tmp_path) / ".local" / "share" / "agentctx"


def test_store_defaults_to_db_path(monkeypatch, tmp_path):
    from sessions.store import SessionStore

    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path / "new" / "home"))
    with SessionStore() as store:
        assert store.path == tmp_path / "new" / "home" / "sessions.db"
        store.create("/r", "repo", "m")
    assert (tmp_path / "new" / "home" / "sessions.db").exists()
