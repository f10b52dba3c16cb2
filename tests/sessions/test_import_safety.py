"""Importing a session file that is hostile or broken: refused with one line, nothing
written (no rows, no KV file), never a traceback."""

from __future__ import annotations

import io
import json
import os

import pytest

from sessions import session_file
from sessions.errors import SessionFileError, StoreError
from sessions.session_file import export_session, import_session
from sessions.store import SessionStore

KV_BYTES = os.urandom(5000)
NOW = "2024-05-01T12:00:00.000000+00:00"


@pytest.fixture
def lines(tmp_path) -> list[str]:
    """An exported session with a KV snapshot: header, session, 2 messages, a tool call,
    a manifest, one kv_snapshot record."""
    kv = tmp_path / "src.kv"
    kv.write_bytes(KV_BYTES)
    with SessionStore(tmp_path / "src.db") as src:
        s = src.create("/r", "repo", "m", name="imported")
        src.add_message(s.id, "user", "hi")
        a = src.add_message(s.id, "assistant", "hello", timings={"ttft_s": 0.1})
        src.add_tool_call(s.id, "search", {"q": "x"}, message_id=a.id)
        src.add_manifest(s.id, files=[{"path": "a", "tokens": 1}], message_id=a.id)
        fp = io.StringIO()
        export_session(src, s.id, fp, kv)
    return fp.getvalue().splitlines()


def _edit(line: str, **changes) -> str:
    return json.dumps({**json.loads(line), **changes})


def _text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def _state(store: SessionStore, kv_dir) -> tuple:
    """Everything an import could change: the rows and the files around the KV folder."""
    rows = tuple(
        tuple(store.db.execute(f"select * from {t} order by rowid").fetchall())
        for t in ("sessions", "messages", "tool_calls", "manifests")
    )
    files = sorted(str(p.relative_to(kv_dir.parent)) for p in kv_dir.parent.rglob("*"))
    return rows, files


@pytest.fixture
def target(tmp_path):
    """A store with one session of its own, and its KV folder (home/kv)."""
    home = tmp_path / "home"
    kv_dir = home / "kv"
    kv_dir.mkdir(parents=True)
    with SessionStore(home / "sessions.db") as store:
        store.create("/x", "repo", "m", name="mine")
        yield store, kv_dir


def _refused(target, text: str, words: str, line: int | None = 2) -> SessionFileError:
    store, kv_dir = target
    before = _state(store, kv_dir)
    latest = store.latest()
    with pytest.raises(SessionFileError) as e:
        import_session(store, io.StringIO(text), kv_dir)
    message = str(e.value)
    assert "\n" not in message and words in message, message
    if line is not None:
        assert e.value.line == line, message
    assert _state(store, kv_dir) == before
    assert store.latest() == latest
    return e.value


# 1. The session's id, name and times


BAD_IDS = ["../../../escaped", "", "s-ABCDEF", "s-abc", "s-abcdef0", "S-abcdef", "s-abcdef\n"]


@pytest.mark.parametrize("bad_id", BAD_IDS)
def test_import_refuses_an_id_not_of_the_store_form(target, lines, tmp_path, bad_id):
    _refused(target, _text([lines[0], _edit(lines[1], id=bad_id), *lines[2:]]), "session id")
    # Nothing was written anywhere, in the KV folder or outside it.
    assert not list(tmp_path.rglob("escaped*"))


def test_path_traversal_id_writes_no_file_outside_the_kv_folder(target, lines, tmp_path):
    store, kv_dir = target
    evil = os.path.relpath(tmp_path / "escaped", kv_dir)  # ../../escaped
    with pytest.raises(SessionFileError, match="not a session id"):
        import_session(
            store, io.StringIO(_text([lines[0], _edit(lines[1], id=evil), *lines[2:]])), kv_dir
        )
    assert not (tmp_path / "escaped.kv").exists()
    assert list(kv_dir.iterdir()) == []


BAD_NAMES = {
    "looks like an id": "s-abc123",
    "empty": "",
    "blank": "   ",
    "padded": " name",
    "newline": "two\nlines",
    "long and padded": "x" * 100_000 + " ",
}


@pytest.mark.parametrize("case", list(BAD_NAMES))
def test_import_refuses_a_name_the_store_would_refuse(target, lines, case):
    text = _text([lines[0], _edit(lines[1], name=BAD_NAMES[case]), *lines[2:]])
    assert len(str(_refused(target, text, "name"))) < 200


def test_import_refuses_an_id_that_is_an_existing_name(target, lines):
    store, kv_dir = target
    imported_id = json.loads(lines[1])["id"]
    # An older store (or an older import) may hold a name that looks like an id.
    store.db.execute(
        "insert into sessions (id, name, root_kind, model, created, updated)"
        " values ('s-0000aa', ?, 'none', 'm', ?, ?)",
        [imported_id, NOW, NOW],
    )
    store.db.conn.commit()
    _refused(target, _text(lines), "is the name of an existing session", line=None)


def test_import_refuses_a_name_that_is_an_existing_id(target, lines):
    store, kv_dir = target
    # An id from before import checked ids.
    store.db.execute(
        "insert into sessions (id, root_kind, model, created, updated)"
        " values ('legacy', 'none', 'm', ?, ?)",
        [NOW, NOW],
    )
    store.db.conn.commit()
    text = _text([lines[0], _edit(lines[1], name="legacy"), *lines[2:]])
    _refused(target, text, "is the id of an existing session", line=None)


BAD_TIMES = {
    "letters": "zzzz",
    "no microseconds": "2024-05-01T12:00:00+00:00",
    "Z for UTC": "2024-05-01T12:00:00.000000Z",
    "another zone": "2024-05-01T12:00:00.000000+02:00",
    "month 13": "2024-13-01T12:00:00.000000+00:00",
    "february 30": "2024-02-30T12:00:00.000000+00:00",
    "arabic digits": "٢٠٢٤-05-01T12:00:00.000000+00:00",
    "empty": "",
}


@pytest.mark.parametrize("case", list(BAD_TIMES))
def test_import_refuses_a_timestamp_the_store_would_not_write(target, lines, case):
    bad = BAD_TIMES[case]
    _refused(target, _text([lines[0], _edit(lines[1], updated=bad), *lines[2:]]), "'updated'")
    _refused(target, _text([lines[0], _edit(lines[1], created=bad), *lines[2:]]), "'created'")
    for n in (2, 4, 5):  # a message, the tool call, the manifest
        edited = [*lines[:n], _edit(lines[n], created=bad), *lines[n + 1 :]]
        _refused(target, _text(edited), "'created'", line=n + 1)


def test_a_bad_updated_time_cannot_make_the_import_the_latest_session(target, lines):
    store, _ = target
    mine = store.latest()
    _refused(target, _text([lines[0], _edit(lines[1], updated="zzzz"), *lines[2:]]), "zzzz")
    assert store.latest() == mine


def test_a_good_file_still_imports_with_its_kv(target, lines):
    store, kv_dir = target
    s = import_session(store, io.StringIO(_text(lines)), kv_dir)
    assert s.name == "imported" and s.message_count == 2
    assert (kv_dir / f"{s.id}.kv").read_bytes() == KV_BYTES
    assert [p.name for p in kv_dir.iterdir()] == [f"{s.id}.kv"]


def test_blank_strings_in_a_list_of_lines_do_not_end_the_file(target, lines):
    store, kv_dir = target
    s = import_session(store, [lines[0], "", *lines[1:]], kv_dir)
    assert s.message_count == 2 and (kv_dir / f"{s.id}.kv").read_bytes() == KV_BYTES


# 2. Values Python reads but SQLite (or JSON) cannot hold


def test_deeply_nested_json_line(target, lines):
    _refused(target, _text([*lines[:2], "[" * 100_000]), "nested too deeply", line=3)


def test_deeply_nested_but_parseable_value(target, lines):
    deep = json.loads("[" * 500 + "]" * 500)
    text = _text([*lines[:2], _edit(lines[2], timings={"x": deep}), *lines[3:]])
    _refused(target, text, "nested more than", line=3)


SURROGATES = {
    "content": (2, {"content": "\ud800"}, "'content'"),
    "name": (1, {"name": "a\udcffb"}, "'name'"),
    "root": (1, {"root": "/r\ud800"}, "'root'"),
    "a key in arguments": (4, {"arguments": {"\udc80": 1}}, "'arguments'"),
    "a value deep in a manifest": (5, {"files": [{"path": "\ud83d"}]}, "'files'"),
}


@pytest.mark.parametrize("case", list(SURROGATES))
def test_lone_surrogates(target, lines, case):
    n, changes, words = SURROGATES[case]
    edited = [*lines[:n], _edit(lines[n], **changes), *lines[n + 1 :]]
    assert "\\ud" in edited[n].lower()  # the JSON escape, as a hostile file would have it
    _refused(target, _text(edited), "lone surrogate", line=n + 1)


@pytest.mark.parametrize(
    "n, changes, words",
    [
        (2, {"seq": 2**70}, "'seq'"),
        (2, {"tokens": -(2**63) - 1}, "'tokens'"),
        (5, {"tokens": 2**63}, "'tokens'"),
        (4, {"message_seq": 2**64}, "'message_seq'"),
        (6, {"size": 2**70}, "'size'"),
    ],
)
def test_integers_beyond_64_bits(target, lines, n, changes, words):
    edited = [*lines[:n], _edit(lines[n], **changes), *lines[n + 1 :]]
    _refused(target, _text(edited), f"{words} is out of range", line=n + 1)


def test_an_integer_python_will_not_read(target, lines):
    line = lines[2].replace('"seq": 1', '"seq": ' + "1" * 5000)
    _refused(target, _text([*lines[:2], line, *lines[3:]]), "not valid JSON", line=3)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers(target, lines, literal):
    line = json.dumps({**json.loads(lines[3]), "timings": {"ttft_s": 0.0}})
    line = line.replace('"ttft_s": 0.0', f'"ttft_s": {literal}')  # (not a time's "50.0...")
    _refused(target, _text([*lines[:3], line, *lines[4:]]), "not a finite number", line=4)


def test_non_ascii_kv_data(target, lines):
    _refused(target, _text([*lines[:6], _edit(lines[6], data="é" * 8)]), "base64", line=7)


def test_kv_longer_than_its_size(target, lines):
    _refused(target, _text([*lines[:6], _edit(lines[6], size=10)]), "longer than", line=7)


def test_record_type_that_is_not_a_string(target, lines):
    _refused(target, _text([*lines, json.dumps({"type": ["session"]})]), "unknown", line=8)


def test_a_kv_file_that_cannot_be_placed_leaves_no_session(target, lines):
    store, kv_dir = target
    session_id = json.loads(lines[1])["id"]
    (kv_dir / f"{session_id}.kv").mkdir()  # something in the way of the snapshot
    before = _state(store, kv_dir)
    with pytest.raises(StoreError, match="cannot write the KV snapshot") as e:
        import_session(store, io.StringIO(_text(lines)), kv_dir)
    assert "\n" not in str(e.value)
    assert _state(store, kv_dir) == before  # no rows, no temporary file left
    with pytest.raises(StoreError):
        store.get(session_id)


def test_a_kv_folder_that_is_a_file(target, lines):
    store, kv_dir = target
    kv_dir.rmdir()
    kv_dir.write_text("not a folder")
    before = _state(store, kv_dir)
    with pytest.raises(StoreError, match="cannot write the KV snapshot"):
        import_session(store, io.StringIO(_text(lines)), kv_dir)
    assert _state(store, kv_dir) == before
    assert kv_dir.read_text() == "not a folder"


def test_a_failed_commit_removes_the_placed_kv_file(target, lines):
    store, kv_dir = target
    session_id = json.loads(lines[1])["id"]
    # A trigger that fails only at COMMIT: a deferred foreign key to a session that never
    # exists. The KV file is put in place just before the commit.
    store.db.execute("PRAGMA foreign_keys = ON")
    store.db.execute(
        "create table pins (sid text references nowhere (id) deferrable initially deferred)"
    )
    store.db.execute("create table nowhere (id text primary key)")
    store.db.execute(
        "create trigger pin after insert on sessions begin insert into pins values ('x'); end"
    )
    store.db.conn.commit()
    before = _state(store, kv_dir)
    with pytest.raises(StoreError, match="FOREIGN KEY"):
        import_session(store, io.StringIO(_text(lines)), kv_dir)
    assert _state(store, kv_dir) == before
    assert not (kv_dir / f"{session_id}.kv").exists()


# 3. Files that are not regular files, and endless lines


def test_import_refuses_dev_zero_by_path(target):
    store, kv_dir = target
    before = _state(store, kv_dir)
    with pytest.raises(SessionFileError, match="/dev/zero is not a regular file"):
        import_session(store, "/dev/zero", kv_dir)
    assert _state(store, kv_dir) == before


@pytest.mark.timeout(30)
def test_import_refuses_a_fifo_without_blocking(target, tmp_path):
    store, kv_dir = target
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(SessionFileError, match="not a regular file"):
        import_session(store, fifo, kv_dir)
    with pytest.raises(SessionFileError, match="not a regular file"):
        import_session(store, str(tmp_path), kv_dir)  # a directory


def test_import_by_path(target, lines, tmp_path):
    store, kv_dir = target
    path = tmp_path / "s.jsonl"
    path.write_text(_text(lines), encoding="utf-8")
    s = import_session(store, path, kv_dir)
    assert (kv_dir / f"{s.id}.kv").read_bytes() == KV_BYTES
    with pytest.raises(SessionFileError, match="cannot open"):
        import_session(store, tmp_path / "missing.jsonl", kv_dir)


def test_import_refuses_a_file_that_is_not_utf8(target, lines, tmp_path):
    store, kv_dir = target
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(_text(lines[:2]).encode() + b'{"caf\xe9": 1}\n')
    before = _state(store, kv_dir)
    with pytest.raises(SessionFileError, match="line 3: not UTF-8"):
        import_session(store, path, kv_dir)
    with open(path, encoding="utf-8") as fp, pytest.raises(SessionFileError, match="not UTF-8"):
        import_session(store, fp, kv_dir)
    assert _state(store, kv_dir) == before


def test_an_endless_line_from_an_open_file_is_cut_off(target, monkeypatch):
    store, kv_dir = target
    monkeypatch.setattr(session_file, "MAX_LINE_CHARS", 1 << 20)
    before = _state(store, kv_dir)
    too_long = pytest.raises(SessionFileError, match="line 1: line is longer than 1048576")
    with open("/dev/zero", encoding="utf-8") as fp, too_long:
        import_session(store, fp, kv_dir)
    assert _state(store, kv_dir) == before


def test_the_line_cap_leaves_room_for_real_lines(lines):
    # A KV record (the longest a real export writes) is far below the cap.
    longest_real = len(json.dumps({"type": "kv_snapshot", "part": 0, "parts": 1, "size": 0}))
    longest_real += -(-session_file.KV_PART_BYTES // 3) * 4
    assert 32 * longest_real <= session_file.MAX_LINE_CHARS
    text = _text(lines)
    assert session_file.read_session_file(io.StringIO(text)).has_kv


def test_an_export_of_non_finite_timings_imports_again(tmp_path):
    """A store may hold NaN (an older agentctx stored what the engine gave): the export
    writes null for it, so the file imports."""
    with SessionStore(tmp_path / "a.db") as src, SessionStore(tmp_path / "b.db") as dst:
        s = src.create("/tmp/x", "repo", "default")
        src.add_message(s.id, "user", "q")
        src.add_message(s.id, "assistant", "a", timings={"decode_tok_s": float("nan"),
                                                        "ttft_s": float("inf")})  # fmt: skip
        out = io.StringIO()
        export_session(src, s.id, out)
        assert "NaN" not in out.getvalue() and "Infinity" not in out.getvalue()
        got = import_session(dst, io.StringIO(out.getvalue()))
        assert dst.messages(got.id)[-1].timings == {"decode_tok_s": None, "ttft_s": None}
