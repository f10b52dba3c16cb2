"""The store's one SQLite connection: its transactions, and SQLite's errors as StoreError."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from sqlite_utils import Database

from sessions.database import (
    BUSY_TIMEOUT_MS,
    DB_ERRORS,
    check_writable,
    describe_error,
    open_database,
)
from sessions.errors import StoreError
from sessions.paths import db_path
from sessions.transaction import read_transaction, write_transaction

_C = TypeVar("_C", bound="StoreConnection")


class StoreConnection:
    """Opens (creating and migrating) the database at `path`, by default the user's."""

    def __init__(self, path: str | Path | None = None, busy_timeout_ms: int = BUSY_TIMEOUT_MS):
        self.path = Path(path) if path is not None else db_path()
        self.db = open_database(self.path, busy_timeout_ms)

    def close(self) -> None:
        self.db.close()

    def __enter__(self: _C) -> _C:
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
    def snapshot(self: _C) -> Iterator[_C]:
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


class Table:
    """One role of the store (sessions, messages, ...) over its connection. `path` names
    the store in the errors of its @store_errors methods."""

    def __init__(self, connection: StoreConnection):
        self.connection = connection
        self.db = connection.db
        self.path = connection.path

    def transaction(self) -> contextlib.AbstractContextManager[Database]:
        return self.connection.transaction()
