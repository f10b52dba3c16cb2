from __future__ import annotations

import pytest
from sqlite_utils import Database

from sessions.migrations import MIGRATIONS, applied_migrations, migrate
from sessions.store import SessionStore


def test_fresh_database_gets_all(tmp_path):
    db = Database(tmp_path / "x.db")
    assert migrate(db) == list(MIGRATIONS)
    assert applied_migrations(db) == [
        "m001_initial",
        "m002_session_title",
        "m003_message_token_ids",
        "m004_message_search",
        "m005_session_settings",
    ]
    assert {"sessions", "messages", "tool_calls", "manifests", "_migrations"} <= set(
        db.table_names()
    )
    assert "title" in db["sessions"].columns_dict
    assert "token_ids" in db["messages"].columns_dict
    rows = list(db.query("select name, applied_at from _migrations order by rowid"))
    assert [r["name"] for r in rows] == list(MIGRATIONS)
    assert all(r["applied_at"] for r in rows)


def test_rerun_is_a_no_op(tmp_path):
    db = Database(tmp_path / "x.db")
    migrate(db)
    before = list(db.query("select * from _migrations"))
    assert migrate(db) == []
    assert list(db.query("select * from _migrations")) == before


def test_upto(tmp_path):
    db = Database(tmp_path / "x.db")
    assert migrate(db, upto="m001_initial") == ["m001_initial"]
    assert "title" not in db["sessions"].columns_dict
    with pytest.raises(ValueError):
        migrate(db, upto="m999_nope")


def test_database_from_previous_schema_keeps_its_data(tmp_path):
    path = tmp_path / "sessions.db"
    db = Database(path)
    migrate(db, upto="m001_initial")
    now = "2024-01-01T00:00:00.000000+00:00"
    db.execute(
        "insert into sessions (id, name, root, root_kind, model, created, updated)"
        " values ('s-000001', 'old', '/old', 'repo', 'm', ?, ?)",
        [now, now],
    )
    db.execute(
        "insert into messages (session_id, seq, role, content, status, created)"
        " values ('s-000001', 1, 'user', 'from the old days', 'complete', ?)",
        [now],
    )
    db.close()
    with SessionStore(path) as store:
        s = store.get("old")
        assert s.id == "s-000001" and s.title is None and s.message_count == 1
        assert store.messages(s.id)[0].content == "from the old days"
        assert applied_migrations(store.db) == [
            "m001_initial",
            "m002_session_title",
            "m003_message_token_ids",
            "m004_message_search",
            "m005_session_settings",
        ]
        assert [x.id for x in store.list(search="old days")] == ["s-000001"]  # indexed too
        # The new column works, and the old data can grow.
        assert store.session_table.set_title("old", "Old times").title == "Old times"
        assert store.add_message(s.id, "assistant", "still here").seq == 2
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_failed_migration_rolls_back(tmp_path):
    db = Database(tmp_path / "x.db")
    migrate(db, upto="m001_initial")
    # Make m002 fail: the column already exists.
    db.execute("alter table sessions add column title text")
    with pytest.raises(Exception, match="duplicate column"):
        migrate(db)
    assert applied_migrations(db) == ["m001_initial"]
