from __future__ import annotations

import pytest

from sessions.errors import SessionError, SessionNotFound
from sessions.models import Session
from sessions.store import SessionStore


def test_create_and_get_by_id_and_name(store):
    s = store.create("/src/proj", "repo", "qwen3-0.6b", name="proj")
    assert isinstance(s, Session)
    assert s.id.startswith("s-") and len(s.id) == 8
    assert (s.root, s.root_kind, s.model, s.name) == ("/src/proj", "repo", "qwen3-0.6b", "proj")
    assert s.created == s.updated and s.created.endswith("+00:00")
    assert s.message_count == 0 and s.title is None
    assert store.get(s.id) == s
    assert store.get("proj") == s


def test_unnamed_session_and_no_root(store):
    s = store.create(None, "none", "m")
    assert s.name is None and s.root is None
    assert store.get(s.id).id == s.id


def test_unknown_session(store):
    store.create("/r", "repo", "m", name="real")
    with pytest.raises(SessionNotFound) as e:
        store.get("no-such-thing")
    assert "no-such-thing" in str(e.value)
    assert "\n" not in str(e.value)
    assert str(e.value) == (
        "no session with the id or name 'no-such-thing' (an id's start will "
        "do; agentctx sessions list shows them)"
    )


def test_list_newest_first_with_counts_and_latest(store):
    assert store.latest() is None
    assert store.list() == []
    a = store.create("/a", "repo", "m", name="a")
    b = store.create("/b", "book", "m", name="b")
    assert [s.id for s in store.list()] == [b.id, a.id]
    store.add_message(a.id, "user", "hi")
    store.add_message(a.id, "assistant", "hello")
    sessions = store.list()
    assert [s.id for s in sessions] == [a.id, b.id]
    assert [s.message_count for s in sessions] == [2, 0]
    assert store.latest().id == a.id
    assert [s.id for s in store.list(limit=1)] == [a.id]


def test_rename_and_clash(store):
    a = store.create("/a", "repo", "m", name="a")
    store.create("/b", "repo", "m", name="b")
    renamed = store.rename("a", "alpha")
    assert renamed.id == a.id and renamed.name == "alpha"
    with pytest.raises(SessionNotFound):
        store.get("a")
    with pytest.raises(SessionError, match="already exists") as e:
        store.rename(a.id, "b")
    assert "\n" not in str(e.value)
    assert store.get(a.id).name == "alpha"
    assert store.rename("alpha", "alpha").name == "alpha"
    assert store.rename("alpha", None).name is None


def test_create_name_clash(store):
    store.create("/a", "repo", "m", name="a")
    with pytest.raises(SessionError, match="already exists"):
        store.create("/b", "repo", "m", name="a")
    assert len(store.list()) == 1


def test_bad_values(store):
    with pytest.raises(SessionError, match="root kind"):
        store.create("/a", "folder", "m")
    with pytest.raises(SessionError, match="looks like a session id"):
        store.create("/a", "repo", "m", name="s-abc123")
    s = store.create("/a", "repo", "m")
    with pytest.raises(SessionError, match="role"):
        store.add_message(s.id, "robot", "x")
    with pytest.raises(SessionError, match="status"):
        store.add_message(s.id, "user", "x", status="done")
    with pytest.raises(SessionNotFound):
        store.add_message("s-000000", "user", "x")


def test_messages_in_order_and_streaming_update(store):
    s = store.create("/a", "repo", "m")
    store.add_message(s.id, "system", "You read code.")
    store.add_message(s.id, "user", "What does main do?", tokens=6)
    partial = store.add_message(s.id, "assistant", "It st", status="interrupted")
    assert partial.seq == 3
    done = store.update_message(
        partial.id,
        content="It starts the app.",
        status="complete",
        tokens=5,
        timings={"ttft_s": 0.12, "decode_tok_s": 41.5, "prompt_tokens": 900, "cached_tokens": 512},
    )
    assert done.content == "It starts the app." and done.status == "complete"
    assert done.timings["cached_tokens"] == 512
    messages = store.messages(s.id)
    assert [m.seq for m in messages] == [1, 2, 3]
    assert [m.role for m in messages] == ["system", "user", "assistant"]
    assert messages[1].tokens == 6 and messages[0].timings is None
    # Only the fields given change.
    again = store.update_message(partial.id, status="error")
    assert again.content == "It starts the app." and again.tokens == 5
    with pytest.raises(SessionError):
        store.update_message(999_999, content="x")


def test_an_answers_token_ids_are_kept_across_opens(tmp_path):
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        s = store.create("/a", "repo", "m")
        question = store.add_message(s.id, "user", "What does main do?")
        answer = store.add_message(s.id, "assistant", "", status="interrupted")
        assert question.token_ids is None and answer.token_ids is None
        store.update_message(answer.id, content="It st")
        assert store.message_table.get(answer.id).token_ids is None  # (a partial answer: none)
        store.update_message(answer.id, content="It starts.", token_ids=[40, 8601, 13])
        store.update_message(answer.id, status="complete")  # (others are left as they are)
        pinned = store.add_message(s.id, "assistant", "Yes.", token_ids=[9520, 13])
    with SessionStore(path) as store:
        got = store.messages(s.id)
        assert [m.token_ids for m in got] == [None, [40, 8601, 13], [9520, 13]]
        assert got[1].content == "It starts." and got[1].status == "complete"
        assert store.message_table.get(pinned.id).token_ids == [9520, 13]


def test_add_message_touches_updated(store):
    a = store.create("/a", "repo", "m")
    m = store.add_message(a.id, "user", "hi")
    assert store.get(a.id).updated == m.created > a.updated


def test_tool_calls_and_manifests(store):
    s = store.create("/a", "repo", "m")
    m = store.add_message(s.id, "assistant", "reading")
    call = store.add_tool_call(s.id, "read_file", {"path": "main.py"}, message_id=m.id)
    assert call.result is None
    call = store.tool_call_table.update(call.id, result="print('hi')")
    failed = store.add_tool_call(s.id, "read_file", {"path": "../x"}, error="path escapes root")
    assert [(c.name, c.arguments, c.result, c.error) for c in store.tool_calls(s.id)] == [
        ("read_file", {"path": "main.py"}, "print('hi')", None),
        ("read_file", {"path": "../x"}, None, "path escapes root"),
    ]
    assert failed.message_id is None
    manifest = store.add_manifest(
        s.id,
        files=[{"path": "a.py", "tokens": 10}, {"path": "b.py", "tokens": 5}],
        omitted=[{"path": "big.bin", "tokens": 0, "reason": "binary"}],
        commit_sha="abc123",
        message_id=m.id,
    )
    assert manifest.tokens == 15
    assert store.manifests(s.id) == [manifest]
    other = store.create("/b", "repo", "m")
    with pytest.raises(SessionError):
        store.add_tool_call(other.id, "x", message_id=m.id)


def test_delete_cascades(store):
    keep = store.create("/k", "repo", "m", name="keep")
    store.add_message(keep.id, "user", "stay")
    s = store.create("/a", "repo", "m", name="gone")
    m = store.add_message(s.id, "user", "hi")
    store.add_tool_call(s.id, "ls", {}, message_id=m.id)
    store.add_manifest(s.id, files=[{"path": "a", "tokens": 1}], message_id=m.id)
    store.delete("gone")
    with pytest.raises(SessionNotFound):
        store.get(s.id)
    for table in ("messages", "tool_calls", "manifests"):
        rows = store.db.execute(f"select count(*) from {table} where session_id = ?", [s.id])
        assert rows.fetchone()[0] == 0
    assert store.db.execute("select count(*) from messages").fetchone()[0] == 1
    assert [x.id for x in store.list()] == [keep.id]
    with pytest.raises(SessionNotFound):
        store.delete("gone")


def test_persists_across_opens(tmp_path):
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        s = store.create("/a", "repo", "m", name="a")
        store.add_message(s.id, "user", "héllo ✓")
    with SessionStore(path) as store:
        assert store.get("a").message_count == 1
        assert store.messages(s.id)[0].content == "héllo ✓"
        assert store.db.journal_mode == "wal"
        assert store.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert store.db.execute("PRAGMA busy_timeout").fetchone()[0] == 10000


def test_title(store):
    s = store.create("/a", "repo", "m", title="First question")
    assert s.title == "First question"
    assert store.session_table.set_title(s.id, "Better").title == "Better"


def test_renaming_does_not_change_which_session_is_latest(store):
    older = store.create("/r", "repo", "m", name="older")
    newer = store.create("/r", "repo", "m", name="newer")
    store.add_message(newer.id, "user", "the last question")
    assert store.latest().id == newer.id
    store.rename("older", "renamed")
    assert store.latest().id == newer.id  # -c continues the session last asked in
    assert store.get(older.id).updated == older.updated


def test_a_unique_start_of_an_id_finds_its_session(store):
    from sessions.errors import SessionError

    a = store.create("/r", "repo", "m")
    assert store.get(a.id[:4]).id == a.id and store.get(a.id[:-1]).id == a.id
    b = store.create("/r", "repo", "m")
    store.db.execute("update sessions set id = ? where id = ?", [a.id[:3] + "ffff", b.id])
    with pytest.raises(SessionError, match="starts 2 session ids"):
        store.get(a.id[:3])  # "s-" and one hex digit: both
    with pytest.raises(SessionNotFound):
        store.get("s-")  # not an id's start: no hex digit
