"""The session store: sessions and their turns in one SQLite file, safe for several processes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from sessions.database import (
    BUSY_TIMEOUT_MS,
    DB_ERRORS,
    check_writable,
    describe_error,
    open_database,
    store_errors,
)
from sessions.errors import SessionError, SessionNotFound, StoreError
from sessions.identifiers import (  # noqa: F401  (others import them from here)
    ID_FORMAT,
    ID_PATTERN,
    TIMESTAMP_FORMAT,
    is_session_id,
    is_timestamp,
    new_session_id,
    utc_now,
)
from sessions.identifiers import check_name as _check_name
from sessions.models import ROLES, ROOT_KINDS, STATUSES, Manifest, Message, Session, ToolCall
from sessions.paths import db_path
from sessions.transaction import read_transaction, write_transaction

_SESSION_SELECT = """
select s.*, (select count(*) from messages m where m.session_id = s.id) as message_count
from sessions s
"""


def to_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


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
        except DB_ERRORS as e:
            raise StoreError(describe_error(e, self.path)) from None

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[SessionStore]:
        """Reads inside see one state of the store, whatever other processes commit
        meanwhile (an export's messages and tool calls agree)."""
        try:
            with read_transaction(self.db):
                yield self
        except DB_ERRORS as e:
            raise StoreError(describe_error(e, self.path)) from None

    def check_writable(self) -> None:
        """StoreError unless this process can write the store: checked before work whose
        result must be stored (an answer), not after it."""
        check_writable(self.db, self.path)

    # Sessions

    @store_errors
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

    @store_errors
    def get(self, ref: str) -> Session:
        """By id, else by name."""
        row = self._row("s.id = ?", ref) or self._row("s.name = ?", ref)
        if row is None:
            raise SessionNotFound(ref)
        return Session.from_row(row)

    @store_errors
    def latest(self) -> Session | None:
        """The most recently updated session."""
        sessions = self.list(limit=1)
        return sessions[0] if sessions else None

    @store_errors
    def list(self, limit: int | None = None) -> list[Session]:
        """Newest (most recently updated) first, each with its message count."""
        sql = _SESSION_SELECT + " order by s.updated desc, s.rowid desc"
        params: list[Any] = []
        if limit is not None:
            sql += " limit ?"
            params.append(limit)
        return [Session.from_row(row) for row in self.db.query(sql, params)]

    @store_errors
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

    @store_errors
    def set_title(self, ref: str, title: str | None) -> Session:
        with self.transaction():
            session = self.get(ref)
            self.db.execute(
                "update sessions set title = ?, updated = ? where id = ?",
                [title, utc_now(), session.id],
            )
        return self.get(session.id)

    @store_errors
    def delete(self, ref: str) -> Session:
        """Delete a session with its messages, tool calls and manifests (by cascade)."""
        with self.transaction():
            session = self.get(ref)
            self.db.execute("delete from sessions where id = ?", [session.id])
        return session

    # Messages

    @store_errors
    def add_message(
        self,
        session_id: str,
        role: str,
        content: str,
        tokens: int | None = None,
        status: str = "complete",
        timings: dict[str, Any] | None = None,
        token_ids: list[int] | None = None,
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
                " created, timings, token_ids) values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [session_id, seq, role, content, tokens, status, now, to_json(timings)]
                + [to_json(token_ids)],
            )
            self._touch(session_id, now)
            message_id = cursor.lastrowid
        return self.message(message_id)

    @store_errors
    def update_message(
        self,
        message_id: int,
        content: str | None = None,
        status: str | None = None,
        tokens: int | None = None,
        timings: dict[str, Any] | None = None,
        token_ids: list[int] | None = None,
    ) -> Message:
        """Change the given fields only: a streamed answer is written as it grows, then
        marked complete or interrupted (with the ids it was generated as, `token_ids`)."""
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
        if token_ids is not None:
            changes["token_ids"] = to_json(token_ids)
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

    @store_errors
    def delete_messages(self, session_id: str, message_ids: list[int]) -> None:
        """Delete these messages of a session (their tool calls by cascade): a turn that
        failed before it answered anything."""
        with self.transaction():
            self._require(session_id)
            self.db.conn.executemany(
                "delete from messages where id = ? and session_id = ?",
                [(i, session_id) for i in message_ids],
            )
            self._touch(session_id, utc_now())

    @store_errors
    def message(self, message_id: int) -> Message:
        rows = list(self.db.query("select * from messages where id = ?", [message_id]))
        if not rows:
            raise SessionError(f"no message numbered {message_id}")
        return Message.from_row(rows[0])

    @store_errors
    def messages(self, session_id: str) -> list[Message]:
        """In turn (seq) order."""
        self._require(session_id)
        rows = self.db.query(
            "select * from messages where session_id = ? order by seq", [session_id]
        )
        return [Message.from_row(row) for row in rows]

    # Tool calls

    @store_errors
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

    @store_errors
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

    @store_errors
    def tool_calls(self, session_id: str) -> list[ToolCall]:
        self._require(session_id)
        rows = self.db.query(
            "select * from tool_calls where session_id = ? order by id", [session_id]
        )
        return [ToolCall.from_row(row) for row in rows]

    # Manifests

    @store_errors
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

    @store_errors
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
