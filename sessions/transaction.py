"""Transactions: writes that take SQLite's write lock up front, and reads of one snapshot."""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
from collections.abc import Iterator

from sqlite_utils import Database


@contextlib.contextmanager
def write_transaction(db: Database) -> Iterator[Database]:
    """BEGIN IMMEDIATE, so a read-then-write (such as max(seq)+1) holds the write lock
    from the read on and another process cannot slip in between; with busy_timeout set,
    a second writer waits here instead of failing. Nested use becomes a savepoint.
    On any error (a failed COMMIT included) the work is rolled back and the first error
    is raised, not one from the rollback."""
    conn = db.conn
    if conn.in_transaction:
        name = f"sp_{secrets.token_hex(4)}"
        conn.execute(f"SAVEPOINT {name}")
        try:
            yield db
        except BaseException:
            # An error may already have ended the whole transaction, savepoint included.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(f"ROLLBACK TO {name}")
                    conn.execute(f"RELEASE {name}")
            raise
        conn.execute(f"RELEASE {name}")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield db
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


@contextlib.contextmanager
def read_transaction(db: Database) -> Iterator[Database]:
    """Reads that see one state of the database: in WAL mode the first read fixes the
    snapshot, and writers that commit meanwhile (they are not blocked) stay unseen until
    the end. Inside a transaction already, it joins it."""
    conn = db.conn
    if conn.in_transaction:
        yield db
        return
    conn.execute("BEGIN DEFERRED")
    try:
        conn.execute("select count(*) from sqlite_master").fetchone()  # the snapshot starts
        yield db
    finally:
        _rollback(conn)  # (nothing was written: this ends the read)


def _rollback(conn: sqlite3.Connection) -> None:
    # SQLite may have rolled back by itself (disk full, I/O error); a ROLLBACK that fails
    # must not hide the error that caused it.
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
