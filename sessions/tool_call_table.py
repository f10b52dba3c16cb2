"""A session's tool calls: each stored before it runs, its outcome recorded after."""

from __future__ import annotations

from typing import Any

from sessions.connection import Table
from sessions.database import store_errors
from sessions.errors import SessionError
from sessions.identifiers import utc_now
from sessions.message_table import require_message_in
from sessions.models import ToolCall, to_json
from sessions.session_table import require_session, touch_session


class ToolCallTable(Table):
    @store_errors
    def add(
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
            require_session(self.db, session_id)
            require_message_in(self.db, message_id, session_id)
            cursor = self.db.execute(
                "insert into tool_calls (session_id, message_id, name, arguments, result,"
                " error, created) values (?, ?, ?, ?, ?, ?, ?)",
                [session_id, message_id, name, to_json(arguments or {}), result, error, now],
            )
            touch_session(self.db, session_id, now)
            tool_call_id = cursor.lastrowid
        return self.get(tool_call_id)

    @store_errors
    def update(
        self, tool_call_id: int, result: str | None = None, error: str | None = None
    ) -> ToolCall:
        """Record the outcome of a call that was stored before it ran."""
        with self.transaction():
            self.get(tool_call_id)
            self.db.execute(
                "update tool_calls set result = coalesce(?, result),"
                " error = coalesce(?, error) where id = ?",
                [result, error, tool_call_id],
            )
        return self.get(tool_call_id)

    @store_errors
    def get(self, tool_call_id: int) -> ToolCall:
        rows = list(self.db.query("select * from tool_calls where id = ?", [tool_call_id]))
        if not rows:
            raise SessionError(f"no tool call numbered {tool_call_id}")
        return ToolCall.from_row(rows[0])

    @store_errors
    def of_session(self, session_id: str) -> list[ToolCall]:
        require_session(self.db, session_id)
        rows = self.db.query(
            "select * from tool_calls where session_id = ? order by id", [session_id]
        )
        return [ToolCall.from_row(row) for row in rows]
