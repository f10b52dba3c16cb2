"""Export and import one whole session as a JSON Lines file.

Line 1 is a header, {"format": "agentctx-session", "version": 1, "exported": ...}; then one
record per line: the session, its messages, tool calls and manifests. Records refer to
messages by seq, not by database id, so a file moves between stores unchanged.

Import checks the whole file before writing anything, then writes in one transaction.
It keeps the session's id; if a session with that id (or name) already exists, the import
is refused with SessionFileError rather than silently making a second copy.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from sessions.errors import SessionFileError
from sessions.models import ROLES, ROOT_KINDS, STATUSES, Session
from sessions.store import SessionStore, to_json, utc_now

FORMAT = "agentctx-session"
VERSION = 1

_NONE = type(None)
_STR, _OPT_STR = (str,), (str, _NONE)
_INT, _OPT_INT = (int,), (int, _NONE)
_DICT, _OPT_DICT, _LIST = (dict,), (dict, _NONE), (list,)

# Per record type: field -> allowed JSON types. Every field is required except OPTIONAL.
FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "session": {
        "id": _STR,
        "name": _OPT_STR,
        "title": _OPT_STR,
        "root": _OPT_STR,
        "root_kind": _STR,
        "model": _STR,
        "created": _STR,
        "updated": _STR,
    },
    "message": {
        "seq": _INT,
        "role": _STR,
        "content": _STR,
        "tokens": _OPT_INT,
        "status": _STR,
        "created": _STR,
        "timings": _OPT_DICT,
    },
    "tool_call": {
        "message_seq": _OPT_INT,
        "name": _STR,
        "arguments": _DICT,
        "result": _OPT_STR,
        "error": _OPT_STR,
        "created": _STR,
    },
    "kv_snapshot": {"part": _INT, "parts": _INT, "size": _INT, "data": _STR},
    "manifest": {
        "message_seq": _OPT_INT,
        "commit_sha": _OPT_STR,
        "files": _LIST,
        "omitted": _LIST,
        "tokens": _INT,
        "created": _STR,
    },
}
OPTIONAL = {("session", "title")}

# Values that must be one of a fixed set, checked before the database's CHECK would fail.
CHOICES = {
    ("session", "root_kind"): ROOT_KINDS,
    ("message", "role"): ROLES,
    ("message", "status"): STATUSES,
}


@dataclass
class SessionFile:
    """A parsed and validated session file: records without their "type" key."""

    session: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    manifests: list[dict[str, Any]] = field(default_factory=list)
    kv_parts: int = 0
    has_kv: bool = False


KV_PART_BYTES = 3 << 20  # raw bytes of KV snapshot per record (4 MiB of base64)


def export_session(store: SessionStore, ref: str, fp: IO[str], kv_path=None) -> Session:
    """Write the session; with `kv_path`, its KV snapshot file follows as base64
    `kv_snapshot` records (the file's bytes unchanged; the engine checks them on load)."""
    session = store.get(ref)
    messages = store.messages(session.id)
    seq_of = {m.id: m.seq for m in messages}
    records: list[dict[str, Any]] = [
        {"format": FORMAT, "version": VERSION, "exported": utc_now()},
        {
            "type": "session",
            "id": session.id,
            "name": session.name,
            "title": session.title,
            "root": session.root,
            "root_kind": session.root_kind,
            "model": session.model,
            "created": session.created,
            "updated": session.updated,
        },
    ]
    for m in messages:
        records.append(
            {
                "type": "message",
                "seq": m.seq,
                "role": m.role,
                "content": m.content,
                "tokens": m.tokens,
                "status": m.status,
                "created": m.created,
                "timings": m.timings,
            }
        )
    for t in store.tool_calls(session.id):
        records.append(
            {
                "type": "tool_call",
                "message_seq": seq_of.get(t.message_id) if t.message_id is not None else None,
                "name": t.name,
                "arguments": t.arguments,
                "result": t.result,
                "error": t.error,
                "created": t.created,
            }
        )
    for f in store.manifests(session.id):
        records.append(
            {
                "type": "manifest",
                "message_seq": seq_of.get(f.message_id) if f.message_id is not None else None,
                "commit_sha": f.commit_sha,
                "files": f.files,
                "omitted": f.omitted,
                "tokens": f.tokens,
                "created": f.created,
            }
        )
    for record in records:
        fp.write(json.dumps(record, ensure_ascii=False) + "\n")
    if kv_path is not None:
        size = os.path.getsize(kv_path)
        parts = max(1, -(-size // KV_PART_BYTES))
        with open(kv_path, "rb") as kv:
            for part in range(parts):
                data = base64.b64encode(kv.read(KV_PART_BYTES)).decode("ascii")
                record = {"type": "kv_snapshot", "part": part, "parts": parts, "size": size}
                fp.write(json.dumps({**record, "data": data}) + "\n")
    return session


def read_session_file(lines: Iterable[str], kv_sink: IO[bytes] | None = None) -> SessionFile:
    """Parse and check every line; raises SessionFileError naming the first bad line.
    KV snapshot records are decoded into `kv_sink` (skipped without one)."""
    kv_parts = kv_size = kv_written = 0
    parsed: SessionFile | None = None
    seqs: set[int] = set()
    header_seen = False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SessionFileError(f"not valid JSON ({e.msg})", number) from None
        if not isinstance(obj, dict):
            raise SessionFileError("expected a JSON object", number)
        if not header_seen:
            _check_header(obj, number)
            header_seen = True
            continue
        kind = obj.get("type")
        if kind not in FIELDS:
            raise SessionFileError(f"unknown record type {kind!r}", number)
        record = _check_record(kind, obj, number)
        if kind == "session":
            if parsed is not None:
                raise SessionFileError("a second session record", number)
            parsed = SessionFile(session=record)
            continue
        if parsed is None:
            raise SessionFileError(f"{kind} record before the session record", number)
        if kind == "kv_snapshot":
            if record["part"] != kv_parts or (kv_parts and record["size"] != kv_size):
                raise SessionFileError(f"kv_snapshot part {record['part']} is out of order", number)
            try:
                data = base64.b64decode(record["data"], validate=True)
            except binascii.Error:
                raise SessionFileError("kv_snapshot data is not base64", number) from None
            kv_parts, kv_size, kv_written = kv_parts + 1, record["size"], kv_written + len(data)
            parsed.kv_parts = record["parts"]
            if kv_sink is not None:
                kv_sink.write(data)
            continue
        if kind == "message":
            if record["seq"] < 1 or record["seq"] in seqs:
                raise SessionFileError(f"message seq {record['seq']} is not new and >= 1", number)
            seqs.add(record["seq"])
            parsed.messages.append(record)
        else:
            # Messages come before the records that point at them.
            if record["message_seq"] is not None and record["message_seq"] not in seqs:
                raise SessionFileError(f"no message with seq {record['message_seq']}", number)
            (parsed.tool_calls if kind == "tool_call" else parsed.manifests).append(record)
    if not header_seen:
        raise SessionFileError("empty file: no agentctx-session header")
    if parsed is None:
        raise SessionFileError("no session record")
    if kv_parts and (kv_parts != parsed.kv_parts or kv_written != kv_size):
        raise SessionFileError(f"the KV snapshot is incomplete ({kv_written} of {kv_size} bytes)")
    parsed.has_kv = kv_parts > 0
    return parsed


def import_session(store: SessionStore, fp: Iterable[str], kv_dir=None) -> Session:
    """Add the session in the file. Its KV snapshot, if it has one and `kv_dir` is given,
    is written to kv_dir/<session id>.kv once the session is stored."""
    if kv_dir is None:
        return _import(store, read_session_file(fp))
    os.makedirs(kv_dir, exist_ok=True)
    tmp = os.path.join(kv_dir, f".import-{os.getpid()}.kv.tmp")
    try:
        with open(tmp, "wb") as sink:
            data = read_session_file(fp, sink)
        session = _import(store, data)
        if data.has_kv:
            os.replace(tmp, os.path.join(kv_dir, f"{session.id}.kv"))
        return session
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _import(store: SessionStore, data: SessionFile) -> Session:
    s = data.session
    with store.transaction() as db:
        if db.execute("select 1 from sessions where id = ?", [s["id"]]).fetchone():
            raise SessionFileError(f"session {s['id']!r} already exists; delete it first")
        if (
            s["name"] is not None
            and db.execute("select 1 from sessions where name = ?", [s["name"]]).fetchone()
        ):
            raise SessionFileError(f"a session named {s['name']!r} already exists")
        db.execute(
            "insert into sessions (id, name, title, root, root_kind, model, created, updated)"
            " values (?, ?, ?, ?, ?, ?, ?, ?)",
            [s["id"], s["name"], s.get("title"), s["root"], s["root_kind"], s["model"]]
            + [s["created"], s["updated"]],
        )
        id_of: dict[int, int] = {}
        for m in data.messages:
            cursor = db.execute(
                "insert into messages (session_id, seq, role, content, tokens, status,"
                " created, timings) values (?, ?, ?, ?, ?, ?, ?, ?)",
                [s["id"], m["seq"], m["role"], m["content"], m["tokens"], m["status"]]
                + [m["created"], to_json(m["timings"])],
            )
            id_of[m["seq"]] = cursor.lastrowid
        for t in data.tool_calls:
            db.execute(
                "insert into tool_calls (session_id, message_id, name, arguments, result,"
                " error, created) values (?, ?, ?, ?, ?, ?, ?)",
                [s["id"], id_of.get(t["message_seq"]), t["name"], to_json(t["arguments"])]
                + [t["result"], t["error"], t["created"]],
            )
        for f in data.manifests:
            db.execute(
                "insert into manifests (session_id, message_id, commit_sha, files, omitted,"
                " tokens, created) values (?, ?, ?, ?, ?, ?, ?)",
                [s["id"], id_of.get(f["message_seq"]), f["commit_sha"], to_json(f["files"])]
                + [to_json(f["omitted"]), f["tokens"], f["created"]],
            )
    return store.get(s["id"])


def _check_header(obj: dict[str, Any], number: int) -> None:
    if obj.get("format") != FORMAT:
        raise SessionFileError(f"not an {FORMAT} file (format is {obj.get('format')!r})", number)
    if "version" not in obj:
        raise SessionFileError("header has no version", number)
    if obj["version"] != VERSION or isinstance(obj["version"], bool):
        raise SessionFileError(
            f"unsupported version {obj['version']!r} (this agentctx reads version {VERSION})",
            number,
        )


def _check_record(kind: str, obj: dict[str, Any], number: int) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for name, types in FIELDS[kind].items():
        if name not in obj:
            if (kind, name) in OPTIONAL:
                continue
            raise SessionFileError(f"{kind} record is missing {name!r}", number)
        value = obj[name]
        # bool is an int to Python, never to us.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise SessionFileError(f"{kind} field {name!r} has the wrong type", number)
        choices = CHOICES.get((kind, name))
        if choices is not None and value not in choices:
            raise SessionFileError(
                f"{kind} field {name!r} is {value!r}, not one of {choices}", number
            )
        record[name] = value
    return record
