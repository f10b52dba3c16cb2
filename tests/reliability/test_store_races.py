"""Nothing lost when processes race on the store: three `ask --session racer` on a new name
all store their turns (in one session), and `sessions export` while another process writes
sees messages and tool calls of one moment. Real processes, a real SQLite store."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from sessions.store import SessionStore
from tests.reliability.cli_support import AGENTCTX
from tests.reliability.support import make_repo


@pytest.mark.slow
def test_three_racing_creators_store_three_turns(home, tmp_path):
    repo = make_repo(tmp_path / "greeter", {"greet.py": "def greet():\n    return 'hi'\n"})
    questions = [f"Question {i}: what does greet return?" for i in range(3)]
    procs = [
        subprocess.Popen(
            [*AGENTCTX, "ask", "--session", "racer", q, "--repo", str(repo), "--max-tokens", "4"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for q in questions
    ]
    results = [(p, *p.communicate(timeout=300)) for p in procs]
    for p, _, err in results:
        assert p.returncode == 0, err
    store = SessionStore(home / "sessions.db")
    sessions = store.list()
    assert [s.name for s in sessions] == ["racer"]
    msgs = store.messages(sessions[0].id)
    # the first to store created the session (system, packed question); the others followed up
    asked = [m.content.rpartition("Question: ")[2] if m.seq == 2 else m.content
             for m in msgs if m.role == "user"]  # fmt: skip
    assert sorted(asked) == sorted(questions), [m.content[-60:] for m in msgs]
    answers = [m for m in msgs if m.role == "assistant"]
    assert len(answers) == 3 and all(a.status == "complete" for a in answers)
    # each answer follows its own question
    for m in answers:
        assert msgs[m.seq - 2].role == "user"


WRITER = textwrap.dedent(
    """
    import sys, time
    from sessions.store import SessionStore

    store = SessionStore(sys.argv[1])
    deadline = time.monotonic() + float(sys.argv[3])
    n = 0
    while time.monotonic() < deadline:
        with store.transaction():  # a tool step as a turn stores it: message, then its call
            m = store.add_message(sys.argv[2], "assistant", f"step {n}")
            store.add_tool_call(sys.argv[2], "grep", {"pattern": "x"}, "r", message_id=m.id)
        n += 1
    print(n)
    """
)


def test_export_while_another_process_writes(home):
    store = SessionStore(home / "sessions.db")
    s = store.create("/tmp/x", "repo", "default", name="busy")
    with store.transaction():  # a long session: reading its messages takes a while
        for i in range(3000):
            m = store.add_message(s.id, "user" if i % 2 else "assistant", f"message {i} " * 20)
            if i % 2 == 0:
                store.add_tool_call(s.id, "read_file", {"path": "a.py"}, "x" * 200, message_id=m.id)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(home / "sessions.db"), s.id, "30"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    counts = []
    try:
        for _ in range(6):
            proc = subprocess.run([*AGENTCTX, "sessions", "export", s.id], capture_output=True,
                                  text=True, timeout=120)  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            records = [json.loads(line) for line in proc.stdout.splitlines()]
            seqs = {r["seq"] for r in records if r.get("type") == "message"}
            calls = [r for r in records if r.get("type") == "tool_call"]
            unlinked = [c for c in calls if c["message_seq"] not in seqs]
            assert not unlinked, f"{len(unlinked)} of {len(calls)} tool calls lost their message"
            counts.append(len(seqs))
    finally:
        writer.kill()
        writer.wait()
    assert counts[0] >= 3000 and counts[-1] > counts[0], counts  # written meanwhile
