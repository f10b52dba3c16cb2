"""Sessions and their names: create, find, list, rename, retitle, delete."""

from __future__ import annotations

from typing import Any

from sqlite_utils import Database

from sessions.connection import Table
from sessions.database import store_errors
from sessions.errors import SessionError, SessionNotFound
from sessions.identifiers import ID_PATTERN, check_name, new_session_id, utc_now
from sessions.migrations import SEARCHABLE
from sessions.models import ROOT_KINDS, Session, check_choice, to_json

# the first question: the first user message without the packed files before it
_FIRST_QUESTION = (
    f"(select substr({SEARCHABLE.format(c='m.content')}, 1, 200) from messages m"
    " where m.session_id = s.id and m.role = 'user' order by m.seq limit 1)"
)
_SESSION_SELECT = f"""
select s.*, (select count(*) from messages m where m.session_id = s.id) as message_count,
(select count(*) from messages m where m.session_id = s.id and m.role = 'user') as turns,
{_FIRST_QUESTION} as first_question
from sessions s
"""


class SessionTable(Table):
    @store_errors
    def create(
        self,
        root: str | None,
        root_kind: str,
        model: str,
        name: str | None = None,
        title: str | None = None,
    ) -> Session:
        check_choice(root_kind, ROOT_KINDS, "root kind")
        if name is not None:
            check_name(name)
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
        """By id, else by name, else by the start of one id ("s-3f", as `sessions list`
        shows ids; names cannot look like ids, so this never shadows a name)."""
        row = self._row("s.id = ?", ref) or self._row("s.name = ?", ref)
        if row is None and ID_PATTERN.fullmatch(ref):
            rows = list(self.db.query(f"{_SESSION_SELECT} where s.id like ? || '%'", [ref]))
            if len(rows) > 1:
                ids = ", ".join(sorted(r["id"] for r in rows)[:5])
                raise SessionError(f"{ref!r} starts {len(rows)} session ids ({ids}); give more")
            row = rows[0] if rows else None
        if row is None:
            raise SessionNotFound(ref)
        return Session.from_row(row)

    @store_errors
    def latest(self) -> Session | None:
        """The most recently updated session."""
        sessions = self.list(limit=1)
        return sessions[0] if sessions else None

    @store_errors
    def list(self, limit: int | None = None, search: str | None = None) -> list[Session]:
        """Newest (most recently updated) first, each with its message count; with `search`,
        only those whose title or name holds it, or whose questions or answers have all its
        words (full-text, SQLite FTS5)."""
        sql = _SESSION_SELECT
        params: list[Any] = []
        if search is not None and search.strip():
            like = _like(search.strip())
            sql += " where s.title like ? escape '\\' or s.name like ? escape '\\'"
            params += [like, like]
            words = _fts_words(search)
            if words:
                sql += (" or s.id in (select m.session_id from messages m where m.id in"
                        " (select rowid from messages_fts where messages_fts match ?))")  # fmt: skip
                params.append(words)
        sql += " order by s.updated desc, s.rowid desc"
        if limit is not None:
            sql += " limit ?"
            params.append(limit)
        return [Session.from_row(row) for row in self.db.query(sql, params)]

    @store_errors
    def rename(self, ref: str, new_name: str | None) -> Session:
        """Give a session a new unique name, or None to clear it. Its last use does not
        change: `ask -c` still continues the session last asked in."""
        if new_name is not None:
            check_name(new_name)
        with self.transaction():
            session = self.get(ref)
            if new_name is not None and new_name != session.name:
                self._check_name_free(new_name)
            self.db.execute("update sessions set name = ? where id = ?", [new_name, session.id])
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
    def set_settings(self, ref: str, settings: dict[str, Any] | None) -> Session:
        """Store the session's sampling settings (None: none); its last use does not change."""
        with self.transaction():
            session = self.get(ref)
            self.db.execute(
                "update sessions set settings = ? where id = ?", [to_json(settings), session.id]
            )
        return self.get(session.id)

    @store_errors
    def delete(self, ref: str) -> Session:
        """Delete a session with its messages, tool calls and manifests (by cascade)."""
        with self.transaction():
            session = self.get(ref)
            self.db.execute("delete from sessions where id = ?", [session.id])
        return session

    def _row(self, where: str, value: str) -> dict[str, Any] | None:
        rows = list(self.db.query(f"{_SESSION_SELECT} where {where}", [value]))
        return rows[0] if rows else None

    def _check_name_free(self, name: str) -> None:
        if self.db.execute("select 1 from sessions where name = ?", [name]).fetchone():
            raise SessionError(f"a session named {name!r} already exists")


def require_session(db: Database, session_id: str) -> None:
    """SessionNotFound unless a session has this id."""
    if not db.execute("select 1 from sessions where id = ?", [session_id]).fetchone():
        raise SessionNotFound(session_id)


def touch_session(db: Database, session_id: str, now: str) -> None:
    """A write to a session's records makes it the most recently updated."""
    db.execute("update sessions set updated = ? where id = ?", [now, session_id])


def _like(text: str) -> str:
    """A LIKE pattern (escape character backslash) for text anywhere in a value."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _fts_words(text: str) -> str:
    """An FTS5 query for all the words of `text`, each a quoted string (so the user's text is
    never query syntax); words without a letter or digit are left out."""
    words = [w for w in text.split() if any(ch.isalnum() for ch in w)]
    return " ".join('"' + w.replace('"', '""') + '"' for w in words)
