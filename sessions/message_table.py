"""A session's messages: its turns in order, and an answer written as it streams."""

from __future__ import annotations

from typing import Any

from sqlite_utils import Database

from sessions.connection import Table
from sessions.database import store_errors
from sessions.errors import SessionError
from sessions.identifiers import utc_now
from sessions.models import ROLES, STATUSES, Message, check_choice, to_json
from sessions.session_table import require_session, touch_session


class MessageTable(Table):
    @store_errors
    def add(
        self,
        session_id: str,
        role: str,
        content: str,
        tokens: int | None = None,
        status: str = "complete",
        timings: dict[str, Any] | None = None,
        token_ids: list[int] | None = None,
    ) -> Message:
        check_choice(role, ROLES, "role")
        check_choice(status, STATUSES, "status")
        now = utc_now()
        # seq is read and written under one write lock, so concurrent appends each get
        # their own turn number and none is lost.
        with self.transaction():
            require_session(self.db, session_id)
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
            touch_session(self.db, session_id, now)
            message_id = cursor.lastrowid
        return self.get(message_id)

    @store_errors
    def update(
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
            check_choice(status, STATUSES, "status")
            changes["status"] = status
        if tokens is not None:
            changes["tokens"] = tokens
        if timings is not None:
            changes["timings"] = to_json(timings)
        if token_ids is not None:
            changes["token_ids"] = to_json(token_ids)
        with self.transaction():
            message = self.get(message_id)
            if changes:
                assignments = ", ".join(f"{column} = ?" for column in changes)
                self.db.execute(
                    f"update messages set {assignments} where id = ?",
                    [*changes.values(), message_id],
                )
                touch_session(self.db, message.session_id, utc_now())
        return self.get(message_id)

    @store_errors
    def delete(self, session_id: str, message_ids: list[int]) -> None:
        """Delete these messages of a session (their tool calls by cascade): a turn that
        failed before it answered anything."""
        with self.transaction():
            require_session(self.db, session_id)
            self.db.conn.executemany(
                "delete from messages where id = ? and session_id = ?",
                [(i, session_id) for i in message_ids],
            )
            touch_session(self.db, session_id, utc_now())

    @store_errors
    def get(self, message_id: int) -> Message:
        rows = list(self.db.query("select * from messages where id = ?", [message_id]))
        if not rows:
            raise SessionError(f"no message numbered {message_id}")
        return Message.from_row(rows[0])

    @store_errors
    def of_session(self, session_id: str) -> list[Message]:
        """In turn (seq) order."""
        require_session(self.db, session_id)
        rows = self.db.query(
            "select * from messages where session_id = ? order by seq", [session_id]
        )
        return [Message.from_row(row) for row in rows]


def require_message_in(db: Database, message_id: int | None, session_id: str) -> None:
    """SessionError unless the message (when one is named) is one of the session's: a tool
    call or manifest points at a turn of its own session."""
    if message_id is None:
        return
    row = db.execute(
        "select 1 from messages where id = ? and session_id = ?", [message_id, session_id]
    ).fetchone()
    if row is None:
        raise SessionError(f"no message numbered {message_id} in session {session_id!r}")
