"""Session store errors. Each message is one line, shown to the user without a traceback."""

from __future__ import annotations


class StoreError(Exception):
    """Base class; also raised when the database file cannot be opened or is not a database."""


class SessionError(StoreError):
    """A request about a session cannot be done: a name clash, a bad role, a missing message."""


class SessionNotFound(SessionError):
    def __init__(self, ref: str):
        self.ref = ref
        super().__init__(
            f"no session with the id or name {ref!r} (an id's start will do; "
            "agentctx sessions list shows them)"
        )


class SessionFileError(StoreError):
    """A session file cannot be imported; nothing was written."""

    def __init__(self, message: str, line: int | None = None):
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)
