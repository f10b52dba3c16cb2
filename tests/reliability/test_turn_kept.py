"""Nothing lost: a turn ended by kill -9, SIGTERM or SIGHUP mid-answer is in the store with
its question and the answer that had streamed, marked interrupted; SIGINT while the KV
snapshot is written says the turn was stored and the snapshot was not. Real `agentctx ask`
processes, real signals, a real SQLite store, SmolLM2."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from sessions.store import SessionStore
from tests.reliability.cli_support import LONG, last_answer, start, wait_for_answer, wait_until
from tests.reliability.support import make_repo

pytestmark = pytest.mark.slow

FILES = {
    "README.md": "# greeter\n\nPrints a friendly greeting.\n",
    "greet.py": 'def greet(name):\n    return f"Hello, {name}!"\n',
}


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "greeter", FILES)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_mid_answer_keeps_the_turn(home, repo, tmp_path, sig):
    err = tmp_path / "stderr"
    proc = start(["ask", LONG, "--repo", str(repo), "--max-tokens", "400"], err)
    shown = wait_for_answer(proc)
    time.sleep(1.0)  # (stored: the first text at once, then every 0.5 s)
    proc.send_signal(sig)
    shown += proc.stdout.read()
    proc.wait(timeout=60)
    stderr = err.read_text()
    session, msgs = last_answer(home)
    assert [m.role for m in msgs] == ["system", "user", "assistant"], stderr
    assert msgs[1].content.endswith(f"Question: {LONG}")
    answer = msgs[2]
    assert answer.status == "interrupted"
    assert answer.content.strip() and shown.strip().startswith(answer.content.strip()), (
        answer.content,
        shown,
    )
    if sig == signal.SIGKILL:
        return
    # handled as Ctrl-C is: the exit a shell reports for the signal, one line saying where
    # the partial answer went, no traceback
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr
    assert f"interrupted: the partial answer is stored in session {session.id}" in stderr


def test_sigint_while_the_snapshot_is_written(home, repo, tmp_path):
    """The snapshot is written to kv/.<id>.kv.<pid>.tmp: a FIFO there holds its open() until
    the interrupt comes, after the turn was stored complete."""
    store = SessionStore(home / "sessions.db")
    s = store.create(str(repo), "repo", "smollm2-135m", name="snap")
    store.add_message(s.id, "system", "You answer questions about a repository.")
    store.add_message(s.id, "user", "What does greet() return?")
    store.add_message(s.id, "assistant", "A greeting: Hello, name!")
    (home / "kv").mkdir()
    err = tmp_path / "stderr"
    proc = start(["ask", "--session", "snap", "Say hello.", "--max-tokens", "8"], err)
    fifo = home / "kv" / f".{s.id}.kv.{proc.pid}.tmp"
    os.mkfifo(fifo)

    def answered() -> bool:
        assert proc.poll() is None, err.read_text()
        msgs = store.messages(s.id)
        return len(msgs) == 5 and msgs[-1].status == "complete"

    wait_until(answered)
    time.sleep(0.5)  # (into the snapshot's open(), which waits for a reader of the FIFO)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    stderr = err.read_text()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1, stderr
    assert re.fullmatch(
        rf"interrupted: the turn is stored in session {s.id}; its KV snapshot was not "
        r"saved \(the next turn prefills instead\)",
        lines[0],
    ), lines[0]
    msgs = store.messages(s.id)
    assert [m.role for m in msgs[3:]] == ["user", "assistant"]
    assert msgs[3].content == "Say hello." and msgs[4].status == "complete"
    assert not (home / "kv" / f"{s.id}.kv").exists()
