"""Opening the session database, and SQLite's errors as one line each."""

from __future__ import annotations

import functools
import sqlite3
import time
from pathlib import Path
from typing import Any, TypeVar

from sqlite_utils import Database

from sessions.errors import StoreError
from sessions.migrations import migrate

BUSY_TIMEOUT_MS = 10_000

_F = TypeVar("_F")


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
DB_ERRORS = (sqlite3.Error, UnicodeEncodeError, OverflowError)


def store_errors(method: _F) -> _F:
    """Turn SQLite errors of a store method into StoreError with one line. Its write
    transaction has already been rolled back when the error reaches here."""

    @functools.wraps(method)  # type: ignore[arg-type]
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)  # type: ignore[operator]
        except DB_ERRORS as e:
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


def check_writable(db: Database, path: Path) -> None:
    """Raise StoreError unless this process can write the database: its file, its folder
    and its WAL files. A write that changes nothing is tried and rolled back (opening
    read-only succeeds, and BEGIN IMMEDIATE alone succeeds there too)."""
    from sessions.transaction import write_transaction

    try:
        with write_transaction(db):
            db.execute("update _migrations set name = name where 0")
    except sqlite3.Error as e:
        if "readonly" in str(e) or "read-only" in str(e):
            raise StoreError(
                f"the session store {path} is read-only ({e}): a turn could not be stored"
            ) from None
        raise StoreError(describe_error(e, path)) from None
