"""`agentctx ask` with sessions, and `agentctx sessions ...`: real subprocesses, a real
SQLite store under a private AGENTCTX_HOME, real git repositories, the real default model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import git
import pytest

from sessions.store import SessionStore
from tests.app.test_cli import agentctx, assert_one_line_error


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh AGENTCTX_HOME for this test, sharing the session's GGUF cache and config
    (its default model)."""
    shared = os.environ["AGENTCTX_HOME"]
    shared_cache = os.path.join(shared, "cache")
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(os.path.join(shared, "config.json"), home / "config.json")
    os.makedirs(shared_cache, exist_ok=True)
    (home / "cache").symlink_to(shared_cache)
    monkeypatch.setenv("AGENTCTX_HOME", str(home))
    return home


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "greeter"
    root.mkdir()
    r = git.Repo.init(root)
    (root / "README.md").write_text("# greeter\n\nPrints a friendly greeting.\n")
    (root / "greet.py").write_text('def greet(name):\n    return f"Hello, {name}!"\n')
    r.index.add(["README.md", "greet.py"])
    r.index.commit("initial")
    return root


def stored_session(home):
    store = SessionStore(home / "sessions.db")
    session = store.latest()
    return store, session


def make_session(home, name="demo"):
    store = SessionStore(home / "sessions.db")
    s = store.create("/tmp/x", "repo", "default", name=name)
    store.add_message(s.id, "user", "What is this?")
    store.add_message(s.id, "assistant", "A demo — with unicode ✓.")
    store.add_manifest(
        s.id,
        [{"path": "a.py", "tokens": 12}],
        [{"path": "big.bin", "tokens": None, "reason": "binary"}],
    )
    return s


def test_sessions_list_show_rename_rm(home):
    s = make_session(home)
    listed = json.loads(agentctx("sessions", "list", "--json").stdout)
    assert [x["id"] for x in listed] == [s.id] and listed[0]["messages"] == 2
    assert listed[0]["turns"] == 1 and listed[0]["title"] == "What is this?"
    (line,) = agentctx("sessions", "list").stdout.splitlines()
    assert line.startswith(f"{s.id} (demo)  What is this?  /tmp/x  default  1 turn  ")
    shown = json.loads(agentctx("sessions", "show", "demo", "--json").stdout)
    assert [m["role"] for m in shown["messages"]] == ["user", "assistant"]
    assert "A demo" in agentctx("sessions", "show", s.id).stdout
    assert agentctx("sessions", "rename", s.id, "renamed").returncode == 0
    assert json.loads(agentctx("sessions", "list", "--json").stdout)[0]["name"] == "renamed"
    assert agentctx("sessions", "rm", "renamed").returncode == 0
    assert json.loads(agentctx("sessions", "list", "--json").stdout) == []


def test_export_import_round_trip(home, tmp_path):
    s = make_session(home)
    exported = agentctx("sessions", "export", s.id).stdout
    path = tmp_path / "demo.jsonl"
    assert agentctx("sessions", "export", s.id, "-o", str(path)).returncode == 0
    assert (
        path.read_text().splitlines()[1:] == exported.splitlines()[1:]
    )  # line 0 has the export time
    assert agentctx("sessions", "rm", s.id).returncode == 0
    assert agentctx("sessions", "import", str(path)).returncode == 0
    again = agentctx("sessions", "export", s.id).stdout
    assert again.splitlines()[1:] == exported.splitlines()[1:]


def test_sessions_list_search(home):
    s = make_session(home)
    found = json.loads(agentctx("sessions", "list", "--search", "unicode demo", "--json").stdout)
    assert [x["id"] for x in found] == [s.id]
    assert agentctx("sessions", "list", "--search", "absent words").stdout == ""
    odd = agentctx("sessions", "list", "--search", '"NEAR(')
    assert odd.returncode == 0 and odd.stdout == "" and "Traceback" not in odd.stderr


def test_export_as_markdown_to_stdout_and_a_file(home, tmp_path):
    s = make_session(home)
    shown = agentctx("sessions", "export", "demo", "--format", "markdown")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"# demo\n\n- session: {s.id} (demo)\n")
    assert "## You\n\nWhat is this?" in shown.stdout and "A demo — with unicode ✓." in shown.stdout
    path = tmp_path / "demo.md"
    out = agentctx("sessions", "export", s.id, "--format", "markdown", "-o", str(path))
    assert out.returncode == 0 and path.read_text() == shown.stdout
    both = agentctx("sessions", "export", s.id, "--format", "markdown", "--with-kv")
    assert both.returncode == 2 and "--with-kv is for --format jsonl" in both.stderr


def test_unknown_session_name(home):
    make_session(home)
    assert_one_line_error(agentctx("sessions", "show", "nope"), "nope")
    assert_one_line_error(agentctx("sessions", "rm", "nope"), "nope")


def test_bad_session_files_leave_the_store_intact(home, tmp_path):
    s = make_session(home)
    good = agentctx("sessions", "export", s.id).stdout.splitlines()
    bad_version = tmp_path / "v.jsonl"
    bad_version.write_text(
        "\n".join([json.dumps({**json.loads(good[0]), "version": 99}), *good[1:]]) + "\n"
    )
    bad_json = tmp_path / "j.jsonl"
    bad_json.write_text(good[0] + "\n{not json\n")
    before = agentctx("sessions", "list", "--json").stdout
    assert_one_line_error(agentctx("sessions", "import", str(bad_version)), "version")
    assert_one_line_error(agentctx("sessions", "import", str(bad_json)), "line 2")
    assert agentctx("sessions", "list", "--json").stdout == before


def test_corrupted_database_is_reported_and_left_alone(home):
    db = home / "sessions.db"
    db.write_bytes(b"this is not a database" * 100)
    before = db.read_bytes()
    assert_one_line_error(agentctx("sessions", "list"), "sessions.db")
    assert db.read_bytes() == before


def test_continue_without_sessions(home, repo):
    assert_one_line_error(agentctx("ask", "-c", "more?"), "no session to continue")


@pytest.mark.e2e
@pytest.mark.slow
def test_ask_then_continue_in_one_session(home, repo):
    first = agentctx("ask", "What does greet() return?", "--repo", str(repo), "--max-tokens", "24")
    assert first.returncode == 0, first.stderr
    follow = agentctx(
        "ask", "-c", "--json", "And what is the project called?", "--max-tokens", "16"
    )
    assert follow.returncode == 0, follow.stderr
    events = [json.loads(line) for line in follow.stdout.splitlines()]
    assert events[-1]["type"] == "usage" and events[-1]["completion_tokens"] >= 1
    store, session = stored_session(home)
    assert len(store.list()) == 1
    msgs = store.messages(session.id)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert "greet.py" in msgs[1].content and msgs[3].content == "And what is the project called?"
    assert msgs[2].content.strip() and all(m.status == "complete" for m in msgs)
    # the second prompt held the whole first turn: it is longer than the first by that turn
    assert events[-1]["prompt_tokens"] > msgs[2].tokens
    assert events[-1]["session"] == session.id
    assert len(store.manifests(session.id)) == 1
    # turn 1's KV was saved on exit and restored by the new process: turn 2 prefilled only
    # what follows it (at least turn 1's whole prompt, in whole pages, came from the file)
    assert (home / "kv" / f"{session.id}.kv").is_file()
    infos = [e["message"] for e in events if e["type"] == "info"]
    assert any(m.startswith("restored ") and "tokens of KV" in m for m in infos), infos
    assert events[-1]["cached_tokens"] >= msgs[2].timings["prompt_tokens"] // 16 * 16 > 0
    # --no-save stores nothing
    assert (
        agentctx("ask", "--no-save", "Hi?", "--repo", str(repo), "--max-tokens", "4").returncode
        == 0
    )
    assert len(store.list()) == 1


@pytest.mark.e2e
@pytest.mark.slow
def test_ctrl_c_keeps_the_partial_answer(home, repo):
    # the child must see SIGINT at its default: a suite started in the background of a
    # non-interactive shell (`make test &`) inherits SIGINT ignored, and Python then leaves
    # it ignored
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentctx", "ask", "Write a long story about greetings.", "--repo", str(repo),
         "--max-tokens", "400"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    # wait for the answer to start streaming, then interrupt
    first = proc.stdout.read(20)
    assert first
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    store, session = stored_session(home)
    answer = store.messages(session.id)[-1]
    assert answer.role == "assistant" and answer.status == "interrupted"
    assert answer.content.strip()


@pytest.mark.e2e
@pytest.mark.slow
def test_ask_about_a_book(home, tmp_path):
    book = tmp_path / "tale.txt"
    book.write_text(
        "A Tale\n\nChapter 1\n\nTom had a red boat named Swift.\n\n"
        "Chapter 2\n\nTom sailed Swift to the island.\n"
    )
    proc = agentctx("ask", "What was the boat called?", "--book", str(book), "--max-tokens", "16")
    assert proc.returncode == 0, proc.stderr
    assert "packed 3 chapters" in proc.stderr and proc.stdout.strip()
    store, session = stored_session(home)
    assert session.root_kind == "book" and session.root == str(book.resolve())
    assert "Swift" in store.messages(session.id)[1].content


def test_repo_and_book_together_is_a_usage_error(home, repo, tmp_path):
    proc = agentctx("ask", "q", "--repo", str(repo), "--book", str(tmp_path / "b.txt"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_export_with_kv_round_trips_the_snapshot(home, tmp_path):
    s = make_session(home)
    kv = home / "kv" / f"{s.id}.kv"
    assert_one_line_error(
        agentctx("sessions", "export", s.id, "--with-kv", "-o", str(tmp_path / "x.jsonl")),
        "has no KV snapshot",
    )
    assert not (tmp_path / "x.jsonl").exists()
    kv.parent.mkdir()
    payload = os.urandom(7 << 20)  # three base64 records
    kv.write_bytes(payload)
    out = tmp_path / "with-kv.jsonl"
    assert agentctx("sessions", "export", s.id, "--with-kv", "-o", str(out)).returncode == 0
    kinds = [json.loads(line)["type"] for line in out.read_text().splitlines()[1:]]
    assert kinds.count("kv_snapshot") == 3
    # into an empty home: the session and its snapshot, byte for byte
    other = tmp_path / "other"
    other.mkdir()
    env = {"AGENTCTX_HOME": str(other)}
    assert agentctx("sessions", "import", str(out), env=env).returncode == 0
    assert (other / "kv" / f"{s.id}.kv").read_bytes() == payload
    # a file whose KV records stop short is refused whole: no session, no snapshot
    lines = out.read_text().splitlines()
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(lines[:-1]) + "\n")
    third = tmp_path / "third"
    third.mkdir()
    result = agentctx("sessions", "import", str(short), env={"AGENTCTX_HOME": str(third)})
    assert_one_line_error(result, "KV snapshot is incomplete")
    assert not list((third / "kv").glob("*")) if (third / "kv").exists() else True
    # rm deletes the snapshot with the session
    assert agentctx("sessions", "rm", s.id).returncode == 0
    assert not kv.exists()


def test_export_never_replaces_the_store_or_a_special_file(home, tmp_path):
    s = make_session(home)
    for target, needle in (
        (home / "sessions.db", "own session store"),
        (home / "kv" / "x.kv", "own session store"),
        (tmp_path / "missing" / "x.jsonl", "no directory"),
    ):
        (home / "kv").mkdir(exist_ok=True)
        assert_one_line_error(agentctx("sessions", "export", s.id, "-o", str(target)), needle)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert_one_line_error(
        agentctx("sessions", "export", s.id, "-o", str(fifo), timeout=30), "not a regular file"
    )
    assert fifo.is_fifo()
    assert_one_line_error(agentctx("sessions", "export", s.id, "-o", ""), "empty")
    listed = agentctx("sessions", "list")
    assert listed.returncode == 0 and s.id in listed.stdout  # the store is intact


def test_export_through_a_symlink_writes_its_target(home, tmp_path):
    s = make_session(home)
    real = tmp_path / "real.jsonl"
    real.write_text("old\n")
    real.chmod(0o644)
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    proc = agentctx("sessions", "export", s.id, "-o", str(link))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and real.read_text().startswith('{"format": "agentctx-session"')
    assert real.stat().st_mode & 0o777 == 0o644  # the file replaced keeps its mode


def test_rm_whose_snapshot_cannot_be_removed_still_deletes(home):
    s = make_session(home)
    (home / "kv" / f"{s.id}.kv").mkdir(parents=True)  # not a file: unlink fails
    proc = agentctx("sessions", "rm", s.id)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert f"deleted {s.id}" in proc.stdout and "warning" in proc.stderr
    assert s.id not in agentctx("sessions", "list").stdout


def test_list_with_a_huge_limit(home):
    s = make_session(home)
    proc = agentctx("sessions", "list", "-n", "99999999999999999999999")
    assert proc.returncode == 0 and s.id in proc.stdout, proc.stderr


def test_bad_new_session_name_fails_before_the_model_loads(home, repo):
    for name in (" padded", "", "a\nb"):
        proc = agentctx("ask", "What does greet do?", "--repo", str(repo), "--session", name)
        assert_one_line_error(proc, "bad session name")
        assert "loading model" not in proc.stderr


def test_import_of_a_special_file_is_refused(home, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        assert_one_line_error(
            agentctx("sessions", "import", path, timeout=30), "not a regular file"
        )


def test_tui_with_a_store_it_cannot_open_is_one_line(home, repo):
    db = home / "sessions.db"
    db.write_bytes(b"not a database" * 100)
    assert_one_line_error(agentctx("tui", "--repo", str(repo), timeout=60), "sessions.db")
    assert db.read_bytes() == b"not a database" * 100
