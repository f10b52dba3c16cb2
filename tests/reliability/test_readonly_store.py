"""A session store that cannot be written (a 0444 file, a read-only folder) is refused
before the model loads, in one line, and left as it was: the answer would be lost."""

from __future__ import annotations

import subprocess

import pytest

from sessions.store import SessionStore
from tests.reliability.cli_support import AGENTCTX, file_permissions_bind
from tests.reliability.support import make_repo


def _ask(args: list[str]) -> subprocess.CompletedProcess:
    try:
        preexec = file_permissions_bind()
        return subprocess.run([*AGENTCTX, *args], capture_output=True, text=True, timeout=120,
                              preexec_fn=preexec)  # fmt: skip
    except subprocess.SubprocessError as e:  # (root without CAP_SETPCAP: cannot drop them)
        pytest.skip(f"cannot make file permissions bind a child process: {e}")


def _refused(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "loading model" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("agentctx: error:")]
    assert len(errors) == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    return errors[0]


def _store_with_a_session(home):
    store = SessionStore(home / "sessions.db")
    s = store.create("/tmp/x", "repo", "smollm2-135m", name="kept")
    store.add_message(s.id, "user", "What is this?")
    store.add_message(s.id, "assistant", "A demo.")
    store.close()
    return home / "sessions.db"


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_read_only_store_is_refused_before_the_model_loads(home, tmp_path, what):
    repo = make_repo(tmp_path / "r", {"a.py": "x = 1\n"})
    db = _store_with_a_session(home)
    before = db.read_bytes()
    target = db if what == "file" else home
    mode = target.stat().st_mode
    target.chmod(0o444 if what == "file" else 0o555)
    try:
        for args in (["ask", "What is x?", "--repo", str(repo)],
                     ["ask", "--session", "kept", "And then?"],
                     ["ask", "--session", "new-name", "What is x?", "--repo", str(repo)]):  # fmt: skip
            line = _refused(_ask(args))
            assert "sessions.db" in line and "read" in line, line
    finally:
        target.chmod(mode)
    assert db.read_bytes() == before
    assert not (home / "kv").exists()
    store = SessionStore(db)
    assert [len(store.messages(s.id)) for s in store.list()] == [2]


def test_reading_a_read_only_store_still_works(home):
    db = _store_with_a_session(home)
    db.chmod(0o444)
    try:
        proc = _ask(["sessions", "list"])
        assert proc.returncode == 0 and "kept" in proc.stdout, proc.stderr
    finally:
        db.chmod(0o644)
