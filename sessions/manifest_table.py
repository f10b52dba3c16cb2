"""A session's manifests: what was put in the context for a turn, and what was left out."""

from __future__ import annotations

from typing import Any

from sessions.connection import Table
from sessions.database import store_errors
from sessions.identifiers import utc_now
from sessions.message_table import require_message_in
from sessions.models import Manifest, to_json
from sessions.session_table import require_session, touch_session


class ManifestTable(Table):
    @store_errors
    def add(
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
            require_session(self.db, session_id)
            require_message_in(self.db, message_id, session_id)
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
            touch_session(self.db, session_id, now)
            manifest_id = cursor.lastrowid
        rows = list(self.db.query("select * from manifests where id = ?", [manifest_id]))
        return Manifest.from_row(rows[0])

    @store_errors
    def of_session(self, session_id: str) -> list[Manifest]:
        require_session(self.db, session_id)
        rows = self.db.query(
            "select * from manifests where session_id = ? order by id", [session_id]
        )
        return [Manifest.from_row(row) for row in rows]
