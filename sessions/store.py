"""The session store: sessions and their turns in one SQLite file, safe for several processes."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import secrets
import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from sqlite_utils import Database

from sessions.errors import SessionError, SessionNotFound, StoreError
from sessions.migrations import migrate
from sessions.models import ROLES, ROOT_KINDS, STATUSES, Manifest, Message, Session, ToolCall
from sessions.paths import db_path
from sessions.transaction import write_transaction

# Names may not look like ids, so get(ref) is never ambiguous.
ID_PATTERN = re.compile(r"s-[0-9a-f]+")
# Exactly the ids new_session_id() makes; an imported id must be one (it names a file).
ID_FORMAT = re.compile(r"s-[0-9a-f]{6}")
# Exactly what utc_now() writes.
TIMESTAMP_FORMAT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}\+00:00"
)

BUSY_TIMEOUT_MS = 10_000

_F = TypeVar("_F")

_SESSION_SELECT = """
select s.*, (select count(*) from messages m where m.session_id = s.id) as message_count
from sessions s
"""


def utc_now() -> str:
    # Microseconds, so ordering by the ISO text orders turns made in quick succession.
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def new_session_id() -> str:
    return f"s-{secrets.token_hex(3)}"


def is_session_id(text: str) -> bool:
    """Whether `text` is an id of the form the store makes ("s-" and 6 hex digits): safe
    to use in a file name."""
    return isinstance(text, str) and ID_FORMAT.fullmatch(text) is not None


def is_timestamp(text: str) -> bool:
    """Whether `text` is a real UTC time written the way utc_now() writes it."""
    if not isinstance(text, str) or not TIMESTAMP_FORMAT.fullmatch(text):
        return False
    try:
        datetime.fromisoformat(text)
    except ValueError:  # such as month 13
        return False
    return True


def to_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def describe_error(e: BaseException, path: Path) -> str:
    """One line for a failure of SQLite (or of binding a value to it) on the store at `path`."""
    if isinstance(e, UnicodeEncodeError):
        return "text that is not valid UTF-8 (it has a lone surrogate) cannot be stored"
    if isinstance(e, OverflowError):
        return "a number too large for the session store (its integers are 64-bit)"
    text = str(e) or type(e).__name__
    if "locked" in text or "busy" in text:
        return (
            f"the session store {path} is locked by another agentctx ({text});"
            " try again when it is done"
        )
    if "disk is full" in text or "disk I/O" in text:
        return f"cannot write the session store {path} ({text}); nothing was changed"
    return f"session store {path}: {text}"


# What a store method may raise from SQLite, each turned into StoreError.
_DB_ERRORS = (sqlite3.Error, UnicodeEncodeError, OverflowError)


def _store_errors(method: _F) -> _F:
    """Turn SQLite errors of a store method into StoreError with one line. Its write
    transaction has already been rolled back when the error reaches here."""

    @functools.wraps(method)  # type: ignore[arg-type]
    def wrapper(self: SessionStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)  # type: ignore[operator]
        except _DB_ERRORS as e:
            raise StoreError(describe_error(e, self.path)) from None

    return wrapper  # type: ignore[return-value]


def _enable_wal(db: Database, busy_timeout_ms: int) -> None:
    """Switch to WAL. The switch needs an exclusive lock and SQLite may answer "database is
    locked" at once, without waiting out the busy timeout, while another process is opening
    the same new file: retry for up to the busy timeout."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            db.enable_wal()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _check_ours(db: Database, path: Path) -> None:
    """Refuse a SQLite file that holds something other than a session store, before
    anything writes to it (the WAL switch, migrations): it is left exactly as it was.
    A file with no schema at all is a new store."""
    names = [row[0] for row in db.execute("select name from sqlite_master")]
    if not names:
        return
    if "_migrations" in names:
        try:
            row = db.execute("select 1 from _migrations where name = 'm001_initial'").fetchone()
        except sqlite3.OperationalError:  # another application's _migrations table
            row = None
        if row is not None:
            return
    shown = ", ".join(sorted(n for n in names if not n.startswith("sqlite_"))[:5])
    raise StoreError(
        f"{path} is not an agentctx session database (it holds other tables: {shown});"
        " it was left unchanged"
    )


def open_database(path: Path, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> Database:
    """Open (creating if needed) and migrate the database. A file that is not a SQLite
    database, or is another application's database, raises StoreError and is left
    exactly as it was."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"cannot create {path.parent}: {e.strerror}") from None
    db = None
    try:
        db = Database(path)
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        # Reads the header before anything could write to the file.
        db.execute("PRAGMA schema_version").fetchone()
        _check_ours(db, path)
        _enable_wal(db, busy_timeout_ms)
        db.execute("PRAGMA foreign_keys = ON")
        migrate(db)
    except sqlite3.Error as e:
        if db is not None:
            db.close()
        if "locked" in str(e):
            raise StoreError(describe_error(e, path)) from None
        raise StoreError(f"cannot open session database {path}: {e}") from None
    except BaseException:
        if db is not None:
            db.close()
        raise
    return db


class SessionStore:
    """Every method raises StoreError (never a raw sqlite3 error) when SQLite fails: the
    file is locked by another process for longer than `busy_timeout_ms`, the disk is full,
    the file is damaged. A failed write changes nothing."""

    def __init__(self, path: str | Path | None = None, busy_timeout_ms: int = BUSY_TIMEOUT_MS):
        self.path = Path(path) if path is not None else db_path()
        self.db = open_database(self.path, busy_timeout_ms)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Database]:
        """One write transaction; the store's own writes inside it join it. A SQLite error
        in it (or in taking the lock, or committing) rolls it back and becomes StoreError."""
        try:
            with write_transaction(self.db) as db:
                yield db
        except _DB_ERRORS as e:
            raise StoreError(describe_error(e, self.path)) from None

    # Sessions

    @_store_errors
    def create(
        self,
        root: str | None,
        root_kind: str,
        model: str,
        name: str | None = None,
        title: str | None = None,
    ) -> Session:
        _check(root_kind, ROOT_KINDS, "root kind")
        if name is not None:
            _check_name(name)
        now = utc_now()
        with self.transaction():
            if name is not None:
                self._check_name_free(name)
            session_id = new_session_id()
            while self._row("s.id = ?", session_id) is not None:
                session_id = new_session_id()
            self.db.execute(
                "insert into sessions (id, name, root, root_kind, model, created, updated, title)"
                " values (?, ?, ?, ?, ?, ?, ?, ?)",
                [session_id, name, root, root_kind, model, now, now, title],
            )
        return self.get(session_id)

    @_store_errors
    def get(self, ref: str) -> Session:
        """By id, else by name."""
        row = self._row("s.id = ?", ref) or self._row("s.name = ?", ref)
        if row is None:
            raise SessionNotFound(ref)
        return Session.from_row(row)

    @_store_errors
    def latest(self) -> Session | None:
        """The most recently updated session."""
        sessions = self.list(limit=1)
        return sessions[0] if sessions else None

    @_store_errors
    def list(self, limit: int | None = None) -> list[Session]:
        """Newest (most recently updated) first, each with its message count."""
        sql = _SESSION_SELECT + " order by s.updated desc, s.rowid desc"
        params: list[Any] = []
        if limit is not None:
            sql += " limit ?"
            params.append(limit)
        return [Session.from_row(row) for row in self.db.query(sql, params)]

    @_store_errors
    def rename(self, ref: str, new_name: str | None) -> Session:
        """Give a session a new unique name, or None to clear it."""
        if new_name is not None:
            _check_name(new_name)
        with self.transaction():
            session = self.get(ref)
            if new_name is not None and new_name != session.name:
                self._check_name_free(new_name)
            self.db.execute(
                "update sessions set name = ?, updated = ? where id = ?",
                [new_name, utc_now(), session.id],
            )
        return self.get(session.id)

    @_store_errors
    def set_title(self, ref: str, title: str | None) -> Session:
        with self.transaction():
            session = self.get(ref)
            self.db.execute(
                "update sessions set title = ?, updated = ? where id = ?",
                [title, utc_now(), session.id],
            )
        return self.get(session.id)

    @_store_errors
    def delete(self, ref: str) -> Session:
        """Delete a session with its messages, tool calls and manifests (by cascade)."""
        with self.transaction():
            session = self.get(ref)
            self.db.execute("delete from sessions where id = ?", [session.id])
        return session

    # Messages

    @_store_errors
    def add_message(
        self,
        session_id: str,
        role: str,
        content: str,
        tokens: int | None = None,
        status: str = "complete",
        timings: dict[str, Any] | None = None,
    ) -> Message:
        _check(role, ROLES, "role")
        _check(status, STATUSES, "status")
        now = utc_now()
        # seq is read and written under one write lock, so concurrent appends each get
        # their own turn number and none is lost.
        with self.transaction():
            self._require(session_id)
            (seq,) = self.db.execute(
                "select coalesce(max(seq), 0) + 1 from messages where session_id = ?",
                [session_id],
            ).fetchone()
            cursor = self.db.execute(
                "insert into messages (session_id, seq, role, content, tokens, status,"
                " created, timings) values (?, ?, ?, ?, ?, ?, ?, ?)",
                [session_id, seq, role, content, tokens, status, now, to_json(timings)],
            )
            self._touch(session_id, now)
            message_id = cursor.lastrowid
        return self.message(message_id)

    @_store_errors
    def update_message(
        self,
        message_id: int,
        content: str | None = None,
        status: str | None = None,
        tokens: int | None = None,
        timings: dict[str, Any] | None = None,
    ) -> Message:
        """Change the given fields only: a streamed answer is written as it grows, then
        marked complete or interrupted."""
        changes: dict[str, Any] = {}
        if content is not None:
            changes["content"] = content
        if status is not None:
            _check(status, STATUSES, "status")
            changes["status"] = status
        if tokens is not None:
            changes["tokens"] = tokens
        if timings is not None:
            changes["timings"] = to_json(timings)
        with self.transaction():
            message = self.message(message_id)
            if changes:
                assignments = ", ".join(f"{column} = ?" for column in changes)
                self.db.execute(
                    f"update messages set {assignments} where id = ?",
                    [*changes.values(), message_id],
                )
                self._touch(message.session_id, utc_now())
        return self.message(message_id)

    @_store_errors
    def message(self, message_id: int) -> Message:
        rows = list(self.db.query("select * from messages where id = ?", [message_id]))
        if not rows:
            raise SessionError(f"no message numbered {message_id}")
        return Message.from_row(rows[0])

    @_store_errors
    def messages(self, session_id: str) -> list[Message]:
        """In turn (seq) order."""
        self._require(session_id)
        rows = self.db.query(
            "select * from messages where session_id = ? order by seq", [session_id]
        )
        return [Message.from_row(row) for row in rows]

    # Tool calls

    @_store_errors
    def add_tool_call(
        self,
        session_id: str,
        name: str,
        arguments: dict[str, Any] | None = None,
        result: str | None = None,
        error: str | None = None,
        message_id: int | None = None,
    ) -> ToolCall:
        now = utc_now()
        with self.transaction():
            self._require(session_id)
            self._check_message_in(message_id, session_id)
            cursor = self.db.execute(
                "insert into tool_calls (session_id, message_id, name, arguments, result,"
                " error, created) values (?, ?, ?, ?, ?, ?, ?)",
                [session_id, message_id, name, to_json(arguments or {}), result, error, now],
            )
            self._touch(session_id, now)
            tool_call_id = cursor.lastrowid
        return self._tool_call(tool_call_id)

    @_store_errors
    def update_tool_call(
        self, tool_call_id: int, result: str | None = None, error: str | None = None
    ) -> ToolCall:
        """Record the outcome of a call that was stored before it ran."""
        with self.transaction():
            self._tool_call(tool_call_id)
            self.db.execute(
                "update tool_calls set result = coalesce(?, result),"
                " error = coalesce(?, error) where id = ?",
                [result, error, tool_call_id],
            )
        return self._tool_call(tool_call_id)

    @_store_errors
    def tool_calls(self, session_id: str) -> list[ToolCall]:
        self._require(session_id)
        rows = self.db.query(
            "select * from tool_calls where session_id = ? order by id", [session_id]
        )
        return [ToolCall.from_row(row) for row in rows]

    # Manifests

    @_store_errors
    def add_manifest(
        self,
        session_id: str,
        files: list[dict[str, Any]],
        omitted: list[dict[str, Any]] | None = None,
        tokens: int | None = None,
        commit_sha: str | None = None,
        message_id: int | None = None,
    ) -> Manifest:
        """tokens defaults to the sum of the files' tokens."""
        if tokens is None:
            tokens = sum(int(f.get("tokens") or 0) for f in files)
        now = utc_now()
        with self.transaction():
            self._require(session_id)
            self._check_message_in(message_id, session_id)
            cursor = self.db.execute(
                "insert into manifests (session_id, message_id, commit_sha, files, omitted,"
                " tokens, created) values (?, ?, ?, ?, ?, ?, ?)",
                [
                    session_id,
                    message_id,
                    commit_sha,
                    to_json(files),
                    to_json(omitted or []),
                    tokens,
                    now,
                ],
            )
            self._touch(session_id, now)
            manifest_id = cursor.lastrowid
        rows = list(self.db.query("select * from manifests where id = ?", [manifest_id]))
        return Manifest.from_row(rows[0])

    @_store_errors
    def manifests(self, session_id: str) -> list[Manifest]:
        self._require(session_id)
        rows = self.db.query(
            "select * from manifests where session_id = ? order by id", [session_id]
        )
        return [Manifest.from_row(row) for row in rows]

    # Helpers

    def _row(self, where: str, value: str) -> dict[str, Any] | None:
        rows = list(self.db.query(f"{_SESSION_SELECT} where {where}", [value]))
        return rows[0] if rows else None

    def _require(self, session_id: str) -> None:
        if not self.db.execute("select 1 from sessions where id = ?", [session_id]).fetchone():
            raise SessionNotFound(session_id)

    def _touch(self, session_id: str, now: str) -> None:
        self.db.execute("update sessions set updated = ? where id = ?", [now, session_id])

    def _check_name_free(self, name: str) -> None:
        if self.db.execute("select 1 from sessions where name = ?", [name]).fetchone():
            raise SessionError(f"a session named {name!r} already exists")

    def _check_message_in(self, message_id: int | None, session_id: str) -> None:
        if message_id is None:
            return
        row = self.db.execute(
            "select 1 from messages where id = ? and session_id = ?", [message_id, session_id]
        ).fetchone()
        if row is None:
            raise SessionError(f"no message numbered {message_id} in session {session_id!r}")

    def _tool_call(self, tool_call_id: int) -> ToolCall:
        rows = list(self.db.query("select * from tool_calls where id = ?", [tool_call_id]))
        if not rows:
            raise SessionError(f"no tool call numbered {tool_call_id}")
        return ToolCall.from_row(rows[0])


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise SessionError(f"unknown {what} {value!r} (expected one of {', '.join(allowed)})")


def _check_name(name: str) -> None:
    if not name.strip() or name != name.strip() or "\n" in name:
        raise SessionError(f"bad session name {name!r}")
    if ID_PATTERN.fullmatch(name):
        raise SessionError(f"session name {name!r} looks like a session id; choose another")
