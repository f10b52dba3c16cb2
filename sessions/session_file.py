"""Export and import one whole session as a JSON Lines file.

Line 1 is a header, {"format": "agentctx-session", "version": 2, "exported": ..., "counts":
{"messages": M, "tool_calls": T, "manifests": F, "kv_parts": K}}; then one record per line:
the session, its messages, tool calls and manifests, and the KV snapshot's parts. Records
refer to messages by seq, not by database id, so a file moves between stores unchanged.
A file that does not hold what its header counts is refused (a copy cut short at a line
boundary parses); version 1 files, written before counts, still import.

Import checks the whole file before writing anything, then writes in one transaction.
It keeps the session's id; if a session with that id (or name) already exists, the import
is refused with SessionFileError rather than silently making a second copy. Import is all
or nothing: the rows and the KV snapshot file are both written, or neither is.

What import refuses, beyond a wrong shape: an id not of the store's own form ("s-" and six
hex digits; it names the KV file), a name the store would not accept from a user, an id or
name that clashes with any existing session's id or name, a timestamp not written the way
the store writes them, a string that is not valid UTF-8 (a lone surrogate escape), an
integer field outside SQLite's 64 bits, NaN or Infinity, JSON nested more than MAX_NESTING
deep, and a line over MAX_LINE_CHARS characters (sessions.session_records checks each record).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from sessions.errors import SessionFileError, StoreError
from sessions.identifiers import utc_now
from sessions.models import Session, to_json
from sessions.session_records import (
    FIELDS,
    FORMAT,
    VERSION,
    check_counts,
    check_header,
    check_record,
    finite,
    kv_part_data,
    parse_line,
    session_record,
    short,
)
from sessions.store import SessionStore

__all__ = ["export_session", "finite", "import_session", "open_session_file", "read_session_file"]

# The longest line read, in characters (newline included). Export writes the KV snapshot
# in parts of KV_PART_BYTES (4 MiB of base64 a line) and every other record is one turn,
# tool call or manifest, so no real line comes near this; it keeps a file with no line
# ends (or an endless stream) from taking all memory.
MAX_LINE_CHARS = 256 << 20


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
    `kv_snapshot` records (the file's bytes unchanged; the engine checks them on load).
    The header counts the records written, the KV snapshot's parts included."""
    session = store.get(ref)
    messages = store.messages(session.id)
    seq_of = {m.id: m.seq for m in messages}
    header: dict[str, Any] = {"format": FORMAT, "version": VERSION, "exported": utc_now()}
    records: list[dict[str, Any]] = [session_record(session)]
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
                "token_ids": m.token_ids,
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
    with contextlib.ExitStack() as stack:
        # opened before the header is written: its size there is the size of what is read
        kv = None if kv_path is None else stack.enter_context(open(kv_path, "rb"))
        size = 0 if kv is None else os.fstat(kv.fileno()).st_size
        parts = 0 if kv is None else max(1, -(-size // KV_PART_BYTES))
        kinds = [r["type"] for r in records]
        header["counts"] = {"messages": kinds.count("message"),
                            "tool_calls": kinds.count("tool_call"),
                            "manifests": kinds.count("manifest"), "kv_parts": parts}  # fmt: skip
        for record in [header, *records]:
            # (NaN and inf, which a store of an older version may hold, become null: JSON
            # has neither, and an import refuses them)
            fp.write(json.dumps(finite(record), ensure_ascii=False, allow_nan=False) + "\n")
        for part in range(parts):
            data = base64.b64encode(kv.read(KV_PART_BYTES)).decode("ascii")
            record = {"type": "kv_snapshot", "part": part, "parts": parts, "size": size}
            fp.write(json.dumps({**record, "data": data}) + "\n")
    return session


def read_session_file(
    lines: Iterable[str] | IO[bytes], kv_sink: IO[bytes] | None = None
) -> SessionFile:
    """Parse and check every line (str, or a binary file's UTF-8 lines); raises
    SessionFileError naming the first bad line. No line may be longer than MAX_LINE_CHARS.
    KV snapshot records are decoded into `kv_sink` (skipped without one)."""
    kv_parts = kv_size = kv_written = 0
    parsed: SessionFile | None = None
    seqs: set[int] = set()
    header_seen = False
    stated: dict[str, int] | None = None
    for number, line in _numbered_lines(lines):
        if not line.strip():
            continue
        obj = parse_line(line, number)
        if not header_seen:
            stated = check_header(obj, number)
            header_seen = True
            continue
        kind = obj.get("type")
        if not isinstance(kind, str) or kind not in FIELDS:
            raise SessionFileError(f"unknown record type {short(kind)}", number)
        record = check_record(kind, obj, number)
        if kind == "session":
            if parsed is not None:
                raise SessionFileError("a second session record", number)
            parsed = SessionFile(session=record)
            continue
        if parsed is None:
            raise SessionFileError(f"{kind} record before the session record", number)
        if kind == "kv_snapshot":
            data = kv_part_data(record, kv_parts, kv_size, parsed.kv_parts, number)
            kv_parts, kv_size, kv_written = kv_parts + 1, record["size"], kv_written + len(data)
            if kv_written > kv_size:
                raise SessionFileError(
                    f"the KV snapshot is longer than its {kv_size} bytes", number
                )
            parsed.kv_parts = record["parts"]
            if kv_sink is not None:
                try:
                    kv_sink.write(data)
                except OSError as e:
                    raise StoreError(f"cannot write the KV snapshot: {_os_reason(e)}") from None
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
    held = dict(messages=len(parsed.messages), tool_calls=len(parsed.tool_calls),
                manifests=len(parsed.manifests), kv_parts=kv_parts)  # fmt: skip
    check_counts(stated, held)
    parsed.has_kv = kv_parts > 0
    return parsed


def open_session_file(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open a session file for import, in binary (read_session_file decodes each line, so
    a byte that is not UTF-8 is reported with its line). Only a regular file is opened: a
    device such as /dev/zero never ends and a FIFO with no writer blocks forever, so both
    are refused with SessionFileError (checked before opening, and again on what was
    opened)."""
    shown = os.fsdecode(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SessionFileError(f"{shown} is not a regular file")
        # O_NONBLOCK: opening a FIFO swapped in since the check cannot block.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise SessionFileError(f"cannot open {shown}: {_os_reason(e)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SessionFileError(f"{shown} is not a regular file")
        os.set_blocking(fd, True)
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def import_session(
    store: SessionStore,
    source: str | os.PathLike[str] | Iterable[str],
    kv_dir: str | os.PathLike[str] | None = None,
) -> Session:
    """Add the session in the file: `source` is its path (only a regular file is read) or
    its lines (an open text file). Its KV snapshot, if it has one and `kv_dir` is given,
    is written to kv_dir/<session id>.kv in the same step: if either the rows or the file
    cannot be written, neither is, and StoreError (SessionFileError for a bad file) says
    why."""
    if isinstance(source, (str, bytes, os.PathLike)):
        with open_session_file(source) as fp:
            return import_session(store, fp, kv_dir)
    if kv_dir is None:
        return _import(store, read_session_file(source))
    kv_dir = os.fspath(kv_dir)
    try:
        os.makedirs(kv_dir, exist_ok=True)
        # A temporary name of the snapshot writer's form, .<name>.<pid>.tmp, so that one
        # left by a killed import is removed once its pid is gone (engine.kv.snapshot_header)
        # and is never counted or removed as a snapshot (*.kv) by the pruner.
        fd, tmp = tempfile.mkstemp(prefix=".import-", suffix=f".kv.{os.getpid()}.tmp", dir=kv_dir)
    except OSError as e:
        raise StoreError(f"cannot write the KV snapshot in {kv_dir}: {_os_reason(e)}") from None
    try:
        try:
            with open(fd, "wb") as sink:
                data = read_session_file(source, sink)
                if data.has_kv:
                    sink.flush()
                    os.fsync(sink.fileno())
        except OSError as e:  # flushing or closing the snapshot (reading errors are caught)
            raise StoreError(f"cannot write the KV snapshot: {_os_reason(e)}") from None
        return _import(store, data, tmp if data.has_kv else None, kv_dir)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # gone already once moved into place


def _import(
    store: SessionStore, data: SessionFile, kv_tmp: str | None = None, kv_dir: str | None = None
) -> Session:
    """Write the rows; with `kv_tmp`, move it to kv_dir/<id>.kv as the last step before the
    commit, and remove it again if the commit fails."""
    s = data.session
    placed: str | None = None
    try:
        with store.transaction() as db:
            _check_free(db, s)
            _insert(db, data)
            if kv_tmp is not None and kv_dir is not None:
                target = os.path.join(kv_dir, f"{s['id']}.kv")
                try:
                    os.replace(kv_tmp, target)
                except OSError as e:
                    raise StoreError(
                        f"cannot write the KV snapshot {target}: {_os_reason(e)}"
                    ) from None
                placed = target
    except BaseException:
        if placed is not None:
            with contextlib.suppress(OSError):
                os.unlink(placed)
        raise
    return store.get(s["id"])


def _check_free(db: Any, s: dict[str, Any]) -> None:
    """Neither the id nor the name may be any existing session's id or name, so that a
    reference (get by id, else by name) always means one session."""
    session_id, name = s["id"], s["name"]
    if db.execute("select 1 from sessions where id = ?", [session_id]).fetchone():
        raise SessionFileError(f"session {session_id!r} already exists; delete it first")
    if db.execute("select 1 from sessions where name = ?", [session_id]).fetchone():
        raise SessionFileError(f"session id {session_id!r} is the name of an existing session")
    if name is None:
        return
    if db.execute("select 1 from sessions where name = ?", [name]).fetchone():
        raise SessionFileError(f"a session named {name!r} already exists")
    if db.execute("select 1 from sessions where id = ?", [name]).fetchone():
        raise SessionFileError(f"session name {name!r} is the id of an existing session")


def _insert(db: Any, data: SessionFile) -> None:
    s = data.session
    db.execute(
        "insert into sessions (id, name, title, root, root_kind, model, created, updated,"
        " settings) values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [s["id"], s["name"], s.get("title"), s["root"], s["root_kind"], s["model"]]
        + [s["created"], s["updated"], to_json(s.get("settings"))],
    )
    id_of: dict[int, int] = {}
    for m in data.messages:
        cursor = db.execute(
            "insert into messages (session_id, seq, role, content, tokens, status,"
            " created, timings, token_ids) values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [s["id"], m["seq"], m["role"], m["content"], m["tokens"], m["status"]]
            + [m["created"], to_json(m["timings"]), to_json(m.get("token_ids"))],
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


def _numbered_lines(lines: Iterable[str] | IO[bytes]) -> Iterator[tuple[int, str]]:
    """(line number, line), refusing a line over MAX_LINE_CHARS before it is all in memory
    (an open file is read with readline's limit), and turning read errors into
    SessionFileError. A binary file's lines are UTF-8 (its limit counts bytes)."""
    readline = getattr(lines, "readline", None)
    iterator = iter(lines) if readline is None else None
    number = 0
    while True:
        number += 1
        try:
            if iterator is not None:  # lines already in memory, such as a list
                line = next(iterator, None)
            else:
                line = readline(MAX_LINE_CHARS + 1) or None  # "" is the end of the file
        except UnicodeDecodeError:
            # A text file decodes ahead of the line it returns: the line is not known.
            raise SessionFileError("the file is not UTF-8 text") from None
        except OSError as e:
            raise SessionFileError(f"cannot read the file: {_os_reason(e)}", number) from None
        if line is None:
            return
        if len(line) > MAX_LINE_CHARS:
            raise _too_long(number)
        if isinstance(line, bytes):  # from open_session_file: decoded a line at a time
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError:
                raise SessionFileError("not UTF-8 text", number) from None
        yield number, line


def _too_long(number: int) -> SessionFileError:
    return SessionFileError(
        f"line is longer than {MAX_LINE_CHARS} characters (not a session file)", number
    )


def _os_reason(e: OSError) -> str:
    return e.strerror or str(e)
