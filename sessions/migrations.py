"""Schema migrations: named functions applied in order, each recorded once in _migrations.

A migration that has shipped is never edited; change the schema with a new one."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from sqlite_utils import Database

from sessions.transaction import write_transaction

Migration = Callable[[Database], None]

# Insertion order is the order they are applied in.
MIGRATIONS: dict[str, Migration] = {}


def migration(fn: Migration) -> Migration:
    if fn.__name__ in MIGRATIONS:
        raise ValueError(f"migration {fn.__name__!r} is registered twice")
    MIGRATIONS[fn.__name__] = fn
    return fn


def applied_migrations(db: Database) -> list[str]:
    if "_migrations" not in db.table_names():
        return []
    return [row["name"] for row in db.query("select name from _migrations order by rowid")]


def migrate(db: Database, upto: str | None = None) -> list[str]:
    """Apply the missing migrations in order, each in its own transaction, stopping after
    `upto` if given. Returns the names applied by this call."""
    if upto is not None and upto not in MIGRATIONS:
        raise ValueError(f"unknown migration {upto!r}")
    names = list(MIGRATIONS)
    if upto is not None:
        names = names[: names.index(upto) + 1]
    if set(names) <= set(applied_migrations(db)):
        return []  # the common case: no write lock taken
    done = []
    for name in names:
        with write_transaction(db):
            db.execute(
                "create table if not exists _migrations"
                " (name text primary key, applied_at text not null)"
            )
            # Checked under the write lock: another process may have just applied it.
            if db.execute("select 1 from _migrations where name = ?", [name]).fetchone():
                continue
            MIGRATIONS[name](db)
            db.execute(
                "insert into _migrations (name, applied_at) values (?, ?)",
                [name, datetime.now(timezone.utc).isoformat(timespec="microseconds")],
            )
            done.append(name)
    return done


def _run(db: Database, *statements: str) -> None:
    # One statement at a time: executescript() would commit the open transaction.
    for sql in statements:
        db.execute(sql)


@migration
def m001_initial(db: Database) -> None:
    _run(
        db,
        """
        create table sessions (
            id text primary key,
            name text unique,
            root text,
            root_kind text not null check (root_kind in ('repo', 'book', 'none')),
            model text not null,
            created text not null,
            updated text not null
        )
        """,
        "create index sessions_updated on sessions (updated)",
        """
        create table messages (
            id integer primary key,
            session_id text not null references sessions (id) on delete cascade,
            seq integer not null,
            role text not null check (role in ('system', 'user', 'assistant', 'tool')),
            content text not null,
            tokens integer,
            status text not null default 'complete'
                check (status in ('complete', 'interrupted', 'error')),
            created text not null,
            timings text
        )
        """,
        # Unique, so two writers can never end up with the same turn number.
        "create unique index messages_session_seq on messages (session_id, seq)",
        """
        create table tool_calls (
            id integer primary key,
            session_id text not null references sessions (id) on delete cascade,
            message_id integer references messages (id) on delete cascade,
            name text not null,
            arguments text not null default '{}',
            result text,
            error text,
            created text not null
        )
        """,
        "create index tool_calls_session on tool_calls (session_id)",
        """
        create table manifests (
            id integer primary key,
            session_id text not null references sessions (id) on delete cascade,
            message_id integer references messages (id) on delete set null,
            commit_sha text,
            files text not null default '[]',
            omitted text not null default '[]',
            tokens integer not null default 0,
            created text not null
        )
        """,
        "create index manifests_session on manifests (session_id)",
    )


@migration
def m002_session_title(db: Database) -> None:
    # A short human title (e.g. the first question), separate from the unique name.
    db.execute("alter table sessions add column title text")


@migration
def m003_message_token_ids(db: Database) -> None:
    # The token ids an answer was generated as (JSON), so a follow-up's prompt can hold
    # exactly them: re-tokenizing the text may give other ids, and the KV is of these.
    db.execute("alter table messages add column token_ids text")


# What a message is searched by: the question of a first turn (the packed repository or book
# before "\nQuestion: " would make every session match its files' words), else the whole text.
SEARCHABLE = (
    "case when instr({c}, char(10) || 'Question: ') > 0"
    " then substr({c}, instr({c}, char(10) || 'Question: ') + 11) else {c} end"
)
_SEARCHED_ROLES = "('user', 'assistant')"


@migration
def m004_message_search(db: Database) -> None:
    # Full-text search of questions and answers (SQLite FTS5, contentless: the text stays in
    # messages; the index holds only what SEARCHABLE takes), kept current by triggers, so
    # every writer (turns, streaming updates, imports, cascaded deletes) keeps it whole.
    new, old = SEARCHABLE.format(c="new.content"), SEARCHABLE.format(c="old.content")
    forget = (f"insert into messages_fts (messages_fts, rowid, text) "
              f"values ('delete', old.id, {old});")  # fmt: skip
    _run(
        db,
        "create virtual table messages_fts using fts5 (text, content='')",
        f"insert into messages_fts (rowid, text) select id, {SEARCHABLE.format(c='content')} "
        f"from messages where role in {_SEARCHED_ROLES}",
        f"create trigger messages_fts_insert after insert on messages when new.role in "
        f"{_SEARCHED_ROLES} begin insert into messages_fts (rowid, text) values (new.id, {new}); end",
        f"create trigger messages_fts_delete after delete on messages when old.role in "
        f"{_SEARCHED_ROLES} begin {forget} end",
        f"create trigger messages_fts_update after update of content on messages when old.role in "
        f"{_SEARCHED_ROLES} begin {forget} insert into messages_fts (rowid, text) "
        f"values (new.id, {new}); end",
    )


@migration
def m005_session_settings(db: Database) -> None:
    # A session's sampling settings as the TUI's /set changed them (JSON), restored on resume.
    db.execute("alter table sessions add column settings text")
