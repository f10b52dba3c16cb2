"""SQLite failures (a lock held by another connection, a full disk, a damaged page, a file
of another application) reach callers as StoreError with one line, and change nothing."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlite_utils import Database

from sessions.errors import StoreError
from sessions.migrations import migrate
from sessions.store import SessionStore

REPO = Path(__file__).resolve().parents[2]


def _rows(path: Path) -> tuple:
    con = sqlite3.connect(path)
    try:
        return tuple(
            tuple(con.execute(f"select * from {t} order by rowid").fetchall())
            for t in ("sessions", "messages", "tool_calls", "manifests")
        )
    finally:
        con.close()


def test_writes_while_another_connection_holds_the_write_lock(tmp_path):
    path = tmp_path / "sessions.db"
    # The store waits out a lock for 10 s by default (test_store checks); 50 ms keeps
    # this test fast.
    with SessionStore(path, busy_timeout_ms=50) as store:
        assert store.db.execute("PRAGMA busy_timeout").fetchone()[0] == 50
        s = store.create("/a", "repo", "m", name="a")
        m = store.add_message(s.id, "user", "hi")
        call = store.add_tool_call(s.id, "ls", {}, message_id=m.id)
        before = _rows(path)

        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        writes = {
            "create": lambda: store.create("/b", "repo", "m"),
            "rename": lambda: store.rename(s.id, "b"),
            "set_title": lambda: store.session_table.set_title(s.id, "t"),
            "delete": lambda: store.delete(s.id),
            "add_message": lambda: store.add_message(s.id, "assistant", "hello"),
            "update_message": lambda: store.update_message(m.id, content="changed"),
            "add_tool_call": lambda: store.add_tool_call(s.id, "cat", {}),
            "update_tool_call": lambda: store.tool_call_table.update(call.id, result="x"),
            "add_manifest": lambda: store.add_manifest(s.id, files=[]),
        }
        for name, write in writes.items():
            with pytest.raises(StoreError, match="locked by another agentctx") as e:
                write()
            assert "\n" not in str(e.value) and str(path) in str(e.value), name
            assert not store.db.conn.in_transaction, name
        with pytest.raises(StoreError, match="locked"), store.transaction() as db:
            db.execute("delete from messages")
        # Reads do not need the write lock (WAL).
        assert store.get("a").message_count == 1
        assert [x.content for x in store.messages(s.id)] == ["hi"]
        other.execute("ROLLBACK")
        other.close()

        assert _rows(path) == before
        # Nothing was left half done: the next writes work.
        assert store.add_message(s.id, "assistant", "hello").seq == 2
        assert store.rename(s.id, "b").name == "b"


def test_opening_a_store_another_connection_locked(tmp_path):
    # A store not yet in WAL (as a new one is while its first opener sets it up).
    path = tmp_path / "sessions.db"
    db = Database(path)
    migrate(db)
    db.close()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match="locked by another agentctx") as e:
            SessionStore(path, busy_timeout_ms=50)
        assert "\n" not in str(e.value)
    finally:
        other.execute("ROLLBACK")
        other.close()
    with SessionStore(path) as store:
        assert store.db.journal_mode == "wal"


def test_sqlite_errors_inside_a_transaction_roll_it_back(store):
    s = store.create("/a", "repo", "m")
    with pytest.raises(StoreError, match="NOT NULL"), store.transaction() as db:
        db.execute("update sessions set title = 'gone' where id = ?", [s.id])
        db.execute("insert into sessions (id) values ('s-000000')")
    assert store.get(s.id).title is None and len(store.list()) == 1


def test_values_sqlite_cannot_hold(store):
    s = store.create("/a", "repo", "m")
    with pytest.raises(StoreError, match="not valid UTF-8"):
        store.add_message(s.id, "user", "bad \udcff byte from the command line")
    with pytest.raises(StoreError, match="too large"):
        store.add_message(s.id, "user", "x", tokens=2**70)
    with pytest.raises(StoreError, match="not valid UTF-8"):
        store.session_table.set_title(s.id, "\ud800")
    assert store.messages(s.id) == [] and store.get(s.id).title is None
    assert store.add_message(s.id, "user", "fine").seq == 1


# Fills the disk: a file-size limit makes SQLite's writes fail (EFBIG) part way.
FULL_DISK = """
import resource, signal, sys
from sessions.errors import StoreError
from sessions.migrations import migrate
from sessions.store import SessionStore

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
store = SessionStore(sys.argv[1])
session = store.get("keep")
resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, resource.RLIM_INFINITY))
for write in (
    lambda: store.add_message(session.id, "user", "x" * 2_000_000),
    lambda: store.create("/b", "repo", "m", title="y" * 2_000_000),
):
    try:
        write()
    except StoreError as e:
        print("StoreError:", e)
    else:
        print("written")
store.close()
"""


def test_a_full_disk_raises_store_error_and_keeps_the_store(tmp_path):
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        s = store.create("/a", "repo", "m", name="keep")
        store.add_message(s.id, "user", "before")
    before = _rows(path)
    child = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    lines = child.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("StoreError: ") for line in lines), lines
    assert all("cannot write the session store" in line for line in lines), lines
    assert _rows(path) == before
    with SessionStore(path) as store:
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert store.add_message(s.id, "assistant", "after").seq == 2


def test_a_damaged_page_raises_store_error_on_read(tmp_path):
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        s = store.create("/a", "repo", "m", name="a")
        for i in range(20):
            store.add_message(s.id, "user", f"turn {i}")
    con = sqlite3.connect(path)
    (root,) = con.execute("select rootpage from sqlite_master where name = 'messages'").fetchone()
    (page_size,) = con.execute("PRAGMA page_size").fetchone()
    con.close()
    assert not Path(f"{path}-wal").exists()  # all in the main file
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * page_size)
    with SessionStore(path) as store:
        with pytest.raises(StoreError, match="malformed") as e:
            store.messages(s.id)
        assert "\n" not in str(e.value) and str(path) in str(e.value)
        with pytest.raises(StoreError, match="malformed"):
            store.add_message(s.id, "user", "more")


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "schema",
    [
        ["create table sessions (token text, user text)", "insert into sessions values ('t', 'u')"],
        # Another tool's own migrations table, with other columns.
        ["create table _migrations (version integer)", "create table sessions (x)"],
        ["create table notes (body text)"],
    ],
)
def test_another_applications_database_is_left_exactly_as_it_was(tmp_path, schema):
    path = tmp_path / "app.db"
    con = sqlite3.connect(path)
    for sql in schema:
        con.execute(sql)
    con.commit()
    con.close()
    before = _md5(path)
    with pytest.raises(StoreError, match="not an agentctx session database") as e:
        SessionStore(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    assert _md5(path) == before
    assert [p.name for p in tmp_path.iterdir()] == ["app.db"]  # no -wal or -shm either
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    con.close()


def test_an_empty_sqlite_file_becomes_a_store(tmp_path):
    path = tmp_path / "sessions.db"
    sqlite3.connect(path).close()  # zero bytes
    with SessionStore(path) as store:
        assert store.create(None, "none", "m").id
