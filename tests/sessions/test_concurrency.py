"""Two real processes appending to one session at the same time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sessions.migrations import MIGRATIONS
from sessions.store import SessionStore

REPO = Path(__file__).resolve().parents[2]

# Opens the store, says it is ready, waits for "go", then appends as fast as it can.
CHILD = """
import sys
from sessions.store import SessionStore

path, session_id, who = sys.argv[1:4]
store = SessionStore(path)
print("ready", flush=True)
sys.stdin.readline()
for i in range(50):
    store.add_message(session_id, "user", f"{who} {i}")
store.close()
"""


def test_two_processes_append_without_collisions(tmp_path):
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        session_id = store.create("/a", "repo", "m").id

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), session_id, who],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        for who in ("a", "b")
    ]
    for child in children:
        assert child.stdout.readline().strip() == "ready"
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err

    with SessionStore(path) as store:
        messages = store.messages(session_id)
        assert len(messages) == 100
        assert [m.seq for m in messages] == list(range(1, 101))
        for who in ("a", "b"):
            # Each process's turns are all there, in the order it wrote them.
            mine = [m.content for m in messages if m.content.startswith(who)]
            assert mine == [f"{who} {i}" for i in range(50)]
        assert store.get(session_id).message_count == 100
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


OPENER = """
import sys
from sessions.store import SessionStore

store = SessionStore(sys.argv[1])
store.add_message(store.create(None, "none", "m").id, "user", "hi")
store.close()
"""


def test_processes_racing_to_create_a_new_database(tmp_path):
    # Each one finds no schema yet; the migrations must still run exactly once.
    path = tmp_path / "new" / "sessions.db"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(path)],
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        for _ in range(4)
    ]
    for child in children:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    with SessionStore(path) as store:
        assert len(store.list()) == 4
        rows = store.db.execute("select name from _migrations").fetchall()
        assert [r[0] for r in rows] == list(MIGRATIONS)
