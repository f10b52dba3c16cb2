from __future__ import annotations

import io
import json

import pytest

from sessions.errors import SessionFileError
from sessions.session_file import export_session, import_session
from sessions.store import SessionStore


def _build(store: SessionStore) -> str:
    s = store.create("/src/книга", "book", "qwen3-0.6b", name="war-and-peace", title="Чтение")
    store.add_message(s.id, "system", "You read books.")
    store.add_message(s.id, "user", "Who is Пьер? 🤔", tokens=7)
    answer = store.add_message(
        s.id,
        "assistant",
        'Пьер Безухов — a count.\nSecond line, "quoted".',
        tokens=12,
        timings={"ttft_s": 0.2, "decode_tok_s": 40.0, "prompt_tokens": 3000, "cached_tokens": 0},
        token_ids=[8413, 2015, 7, 0, 49151],
    )
    store.add_tool_call(s.id, "search", {"q": "Пьер"}, result="ch. 1", message_id=answer.id)
    store.add_tool_call(s.id, "read", {"path": "x"}, error="missing")
    store.add_manifest(
        s.id,
        files=[{"path": "ch1.txt", "tokens": 2000}, {"path": "ch2.txt", "tokens": 1000}],
        omitted=[{"path": "ch99.txt", "tokens": 50000, "reason": "budget"}],
        commit_sha=None,
        message_id=answer.id,
    )
    store.add_message(s.id, "user", "stopped halfway", status="interrupted")
    return s.id


def _export(store: SessionStore, ref: str) -> str:
    fp = io.StringIO()
    export_session(store, ref, fp)
    return fp.getvalue()


def _records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()[1:]]


def _count(store: SessionStore) -> tuple[int, ...]:
    return tuple(
        store.db.execute(f"select count(*) from {t}").fetchone()[0]
        for t in ("sessions", "messages", "tool_calls", "manifests")
    )


def test_round_trip(tmp_path):
    with SessionStore(tmp_path / "a" / "sessions.db") as a:
        session_id = _build(a)
        first = _export(a, "war-and-peace")
    header = json.loads(first.splitlines()[0])
    assert header["format"] == "agentctx-session" and header["version"] == 2
    assert "exported" in header
    assert header["counts"] == {"messages": 4, "tool_calls": 2, "manifests": 1, "kv_parts": 0}
    types = [r["type"] for r in _records(first)]
    assert types == ["session"] + ["message"] * 4 + ["tool_call"] * 2 + ["manifest"]
    assert "Пьер" in first  # written as UTF-8, not \u escapes

    with SessionStore(tmp_path / "b" / "sessions.db") as b:
        imported = import_session(b, io.StringIO(first))
        assert imported.id == session_id and imported.name == "war-and-peace"
        assert imported.title == "Чтение" and imported.message_count == 4
        second = _export(b, session_id)
        messages = b.messages(session_id)
        assert messages[2].timings["decode_tok_s"] == 40.0
        assert messages[2].token_ids == [8413, 2015, 7, 0, 49151]
        assert [m.token_ids for m in messages[:2] + messages[3:]] == [None, None, None]
        calls = b.tool_calls(session_id)
        assert calls[0].message_id == messages[2].id and calls[1].message_id is None
        assert b.manifests(session_id)[0].message_id == messages[2].id
    assert _records(second) == _records(first)


def test_a_file_written_before_token_ids_imports(tmp_path, good):
    """Files exported before answers kept their ids have no token_ids field."""
    lines = [_edit(line, token_ids=...) if '"token_ids"' in line else line for line in good]
    assert not any("token_ids" in line for line in lines)
    with SessionStore(tmp_path / "b.db") as b:
        imported = import_session(b, io.StringIO("\n".join(lines) + "\n"))
        assert [m.token_ids for m in b.messages(imported.id)] == [None] * 4
        assert b.messages(imported.id)[2].content.startswith("Пьер")


def test_import_refuses_an_existing_id_and_changes_nothing(tmp_path):
    with SessionStore(tmp_path / "sessions.db") as store:
        _build(store)
        text = _export(store, "war-and-peace")
        before = _count(store)
        with pytest.raises(SessionFileError, match="already exists"):
            import_session(store, io.StringIO(text))
        assert _count(store) == before


def test_import_refuses_a_taken_name(tmp_path):
    with SessionStore(tmp_path / "a.db") as a:
        text = _export(a, _build(a))
    with SessionStore(tmp_path / "b.db") as b:
        b.create("/x", "repo", "m", name="war-and-peace")
        with pytest.raises(SessionFileError, match="war-and-peace"):
            import_session(b, io.StringIO(text))
        assert _count(b) == (1, 0, 0, 0)


@pytest.fixture
def good(tmp_path) -> list[str]:
    with SessionStore(tmp_path / "src.db") as src:
        return _export(src, _build(src)).splitlines()


def _edit(line: str, **changes) -> str:
    obj = json.loads(line)
    obj.update(changes)
    return json.dumps({k: v for k, v in obj.items() if v is not ...})


BAD = {
    "bad version": (lambda ls: [_edit(ls[0], version=3), *ls[1:]], 1, "version"),
    "float version": (lambda ls: [_edit(ls[0], version=2.0), *ls[1:]], 1, "version 2.0"),
    "no version": (lambda ls: [_edit(ls[0], version=...), *ls[1:]], 1, "version"),
    "wrong format": (lambda ls: [_edit(ls[0], format="other"), *ls[1:]], 1, "format"),
    "bad json": (lambda ls: [*ls[:3], ls[3][:-5], *ls[4:]], 4, "JSON"),
    "missing field": (lambda ls: [*ls[:3], _edit(ls[3], role=...), *ls[4:]], 4, "'role'"),
    "wrong type": (lambda ls: [*ls[:3], _edit(ls[3], seq="2"), *ls[4:]], 4, "'seq'"),
    "bad role": (lambda ls: [*ls[:3], _edit(ls[3], role="robot"), *ls[4:]], 4, "robot"),
    "token ids not a list": (
        lambda ls: [*ls[:4], _edit(ls[4], token_ids="1 2"), *ls[5:]],
        5,
        "'token_ids'",
    ),
    "a token id not an id": (
        lambda ls: [*ls[:4], _edit(ls[4], token_ids=[1, "2"]), *ls[5:]],
        5,
        "token id",
    ),
    "a negative token id": (
        lambda ls: [*ls[:4], _edit(ls[4], token_ids=[1, -2]), *ls[5:]],
        5,
        "token id",
    ),
    "a token id true": (
        lambda ls: [*ls[:4], _edit(ls[4], token_ids=[True]), *ls[5:]],
        5,
        "token id",
    ),
    "unknown type": (lambda ls: [*ls, '{"type": "mystery"}'], 10, "mystery"),
    "duplicate seq": (lambda ls: [*ls[:3], ls[3], *ls[3:]], 5, "seq"),
    "dangling seq": (lambda ls: [*ls, _edit(ls[6], message_seq=42)], 10, "42"),
    "no session": (lambda ls: [ls[0]], None, "no session"),
    "empty": (lambda ls: [], None, "empty"),
    "late last line": (lambda ls: [*ls[:-1], ls[-1] + " garbage"], 9, "JSON"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_files_raise_and_leave_the_store_unchanged(tmp_path, good, case):
    edit, line, words = BAD[case]
    text = "\n".join(edit(good)) + "\n"
    with SessionStore(tmp_path / "sessions.db") as store:
        store.create("/x", "repo", "m", name="already-here")
        before = _count(store)
        with pytest.raises(SessionFileError) as e:
            import_session(store, io.StringIO(text))
        message = str(e.value)
        assert "\n" not in message and words in message
        if line is not None:
            assert message.startswith(f"line {line}:") and e.value.line == line
        assert _count(store) == before
