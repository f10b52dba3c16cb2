"""The session store: sessions and their turns in one SQLite file, safe for several processes.

SessionStore is the connection with one object per role, each its own table:
`session_table` (sessions and their names), `message_table` (turns), `tool_call_table`
and `manifest_table`. The calls the app makes on every turn are also the store's own
methods, by the names they have always had, and go to those objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sessions.connection import StoreConnection
from sessions.database import BUSY_TIMEOUT_MS
from sessions.identifiers import check_name as _check_name  # noqa: F401  (imported from here)
from sessions.identifiers import is_session_id  # noqa: F401  (imported from here)
from sessions.manifest_table import ManifestTable
from sessions.message_table import MessageTable
from sessions.models import Manifest, Message, Session, ToolCall
from sessions.session_table import SessionTable
from sessions.tool_call_table import ToolCallTable


class SessionStore(StoreConnection):
    """Every method raises StoreError (never a raw sqlite3 error) when SQLite fails: the
    file is locked by another process for longer than `busy_timeout_ms`, the disk is full,
    the file is damaged. A failed write changes nothing."""

    def __init__(self, path: str | Path | None = None, busy_timeout_ms: int = BUSY_TIMEOUT_MS):
        super().__init__(path, busy_timeout_ms)
        self.session_table = SessionTable(self)
        self.message_table = MessageTable(self)
        self.tool_call_table = ToolCallTable(self)
        self.manifest_table = ManifestTable(self)

    # Sessions

    def create(
        self,
        root: str | None,
        root_kind: str,
        model: str,
        name: str | None = None,
        title: str | None = None,
    ) -> Session:
        return self.session_table.create(root, root_kind, model, name, title)

    def get(self, ref: str) -> Session:
        """By id, else by name."""
        return self.session_table.get(ref)

    def latest(self) -> Session | None:
        """The most recently updated session."""
        return self.session_table.latest()

    def list(self, limit: int | None = None, search: str | None = None) -> list[Session]:
        """Newest (most recently updated) first, each with its message count; `search`: only
        those whose title or name holds it or whose questions and answers have its words."""
        return self.session_table.list(limit, search)

    def rename(self, ref: str, new_name: str | None) -> Session:
        """Give a session a new unique name, or None to clear it (its last use unchanged)."""
        return self.session_table.rename(ref, new_name)

    def delete(self, ref: str) -> Session:
        """Delete a session with its messages, tool calls and manifests (by cascade)."""
        return self.session_table.delete(ref)

    # Messages

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
        return self.message_table.add(session_id, role, content, tokens, status, timings, token_ids)

    def update_message(
        self,
        message_id: int,
        content: str | None = None,
        status: str | None = None,
        tokens: int | None = None,
        timings: dict[str, Any] | None = None,
        token_ids: list[int] | None = None,
    ) -> Message:
        """Change the given fields only (MessageTable.update)."""
        return self.message_table.update(message_id, content, status, tokens, timings, token_ids)

    def delete_messages(self, session_id: str, message_ids: list[int]) -> None:
        """Delete these messages of a session, with their tool calls."""
        self.message_table.delete(session_id, message_ids)

    def messages(self, session_id: str) -> list[Message]:
        """In turn (seq) order."""
        return self.message_table.of_session(session_id)

    # Tool calls and manifests

    def add_tool_call(
        self,
        session_id: str,
        name: str,
        arguments: dict[str, Any] | None = None,
        result: str | None = None,
        error: str | None = None,
        message_id: int | None = None,
    ) -> ToolCall:
        return self.tool_call_table.add(session_id, name, arguments, result, error, message_id)

    def tool_calls(self, session_id: str) -> list[ToolCall]:
        return self.tool_call_table.of_session(session_id)

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
        return self.manifest_table.add(session_id, files, omitted, tokens, commit_sha, message_id)

    def manifests(self, session_id: str) -> list[Manifest]:
        return self.manifest_table.of_session(session_id)
