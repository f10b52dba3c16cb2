"""Session ids, names and timestamps: the forms the store writes and accepts."""

from __future__ import annotations

import re
import secrets
from datetime import datetime, timezone

from sessions.errors import SessionError

# Names may not look like ids, so get(ref) is never ambiguous.
ID_PATTERN = re.compile(r"s-[0-9a-f]+")
# Exactly the ids new_session_id() makes; an imported id must be one (it names a file).
ID_FORMAT = re.compile(r"s-[0-9a-f]{6}")
# Exactly what utc_now() writes.
TIMESTAMP_FORMAT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}\+00:00"
)


def utc_now() -> str:
    # Microseconds, so ordering by the ISO text orders turns made in quick succession.
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def new_session_id() -> str:
    return f"s-{secrets.token_hex(3)}"


def is_session_id(text: str) -> bool:
    """Whether `text` is an id of the form the store makes ("s-" and 6 hex digits): safe
    to use in a file name."""
    return isinstance(text, str) and ID_FORMAT.fullmatch(text) is not None


def is_timestamp(text: str) -> bool:
    """Whether `text` is a real UTC time written the way utc_now() writes it."""
    if not isinstance(text, str) or not TIMESTAMP_FORMAT.fullmatch(text):
        return False
    try:
        datetime.fromisoformat(text)
    except ValueError:  # such as month 13
        return False
    return True


def check_name(name: str) -> None:
    if not name.strip() or name != name.strip() or "\n" in name:
        raise SessionError(f"bad session name {name!r}")
    if ID_PATTERN.fullmatch(name):
        raise SessionError(f"session name {name!r} looks like a session id; choose another")
