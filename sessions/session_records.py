"""The records of a session file, checked one by one: each record type's fields and their
JSON types, and what a value must be beyond its type (a time the store writes, UTF-8 text,
a finite number, a 64-bit integer, nesting at most MAX_NESTING deep), and the header.

The header states the file's version and, from version 2, how many records of each kind
follow ("counts"), so that a file cut short at a line boundary is told from a whole one.
Version 1 files, written before counts, are read as they were.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

from sessions.errors import SessionError, SessionFileError
from sessions.identifiers import check_name as _check_name
from sessions.identifiers import is_session_id, is_timestamp, utc_now
from sessions.models import ROLES, ROOT_KINDS, STATUSES, Session

FORMAT = "agentctx-session"
VERSION = 2  # the version export writes
VERSIONS = (1, 2)  # those import reads; 1 states no counts
# what a version 2 header counts: records of each kind, and the KV snapshot's parts
COUNTED = ("messages", "tool_calls", "manifests", "kv_parts")

_NONE = type(None)
_STR, _OPT_STR = (str,), (str, _NONE)
_INT, _OPT_INT = (int,), (int, _NONE)
_DICT, _OPT_DICT, _LIST, _OPT_LIST = (dict,), (dict, _NONE), (list,), (list, _NONE)

# Per record type: field -> allowed JSON types. Every field is required except OPTIONAL.
FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "session": {
        "id": _STR,
        "name": _OPT_STR,
        "title": _OPT_STR,
        "settings": _OPT_DICT,  # the TUI's /set changes (from store migration m005)
        "root": _OPT_STR,
        "root_kind": _STR,
        "model": _STR,
        "created": _STR,
        "updated": _STR,
    },
    "message": {
        "seq": _INT,
        "role": _STR,
        "content": _STR,
        "tokens": _OPT_INT,
        "status": _STR,
        "created": _STR,
        "timings": _OPT_DICT,
        "token_ids": _OPT_LIST,  # an answer's generated ids (from store migration m003)
    },
    "tool_call": {
        "message_seq": _OPT_INT,
        "name": _STR,
        "arguments": _DICT,
        "result": _OPT_STR,
        "error": _OPT_STR,
        "created": _STR,
    },
    "kv_snapshot": {"part": _INT, "parts": _INT, "size": _INT, "data": _STR},
    "manifest": {
        "message_seq": _OPT_INT,
        "commit_sha": _OPT_STR,
        "files": _LIST,
        "omitted": _LIST,
        "tokens": _INT,
        "created": _STR,
    },
}
OPTIONAL = {("session", "title"), ("session", "settings"), ("message", "token_ids")}


def session_record(session: Session) -> dict[str, Any]:
    """A session's record in a session file: every field FIELDS["session"] names."""
    return {"type": "session", **{name: getattr(session, name) for name in FIELDS["session"]}}


# Fields that hold a time, written by the store as utc_now() does.
TIMESTAMPS = {"created", "updated"}

# SQLite integers are signed 64-bit.
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1

# The deepest nesting of lists and objects inside a field (tool arguments, timings, the
# manifest's files): far deeper than real data, shallow enough that reading the stored JSON
# back can never hit Python's recursion limit.
MAX_NESTING = 100

# Values that must be one of a fixed set, checked before the database's CHECK would fail.
CHOICES = {
    ("session", "root_kind"): ROOT_KINDS,
    ("message", "role"): ROLES,
    ("message", "status"): STATUSES,
}


def parse_line(line: str, number: int) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise SessionFileError(f"not valid JSON ({e.msg})", number) from None
    except RecursionError:
        raise SessionFileError("JSON nested too deeply", number) from None
    except ValueError as e:  # such as an integer of more than 4300 digits
        raise SessionFileError(f"not valid JSON ({short(str(e))})", number) from None
    if not isinstance(obj, dict):
        raise SessionFileError("expected a JSON object", number)
    return obj


def short(value: Any, limit: int = 60) -> str:
    """repr() of a value from the file, cut short and on one line."""
    text = ascii(value)
    return text if len(text) <= limit else text[:limit] + "..."


def check_header(obj: dict[str, Any], number: int) -> dict[str, int] | None:
    """The counts the header states (None for version 1, which states none)."""
    if obj.get("format") != FORMAT:
        raise SessionFileError(
            f"not an {FORMAT} file (format is {short(obj.get('format'))})", number
        )
    if "version" not in obj:
        raise SessionFileError("header has no version", number)
    version = obj["version"]
    # exactly an int: JSON's 1.0 and true equal 1 to Python, and neither is a version
    if type(version) is not int or version not in VERSIONS:
        raise SessionFileError(
            f"unsupported version {short(version)} (this agentctx reads versions "
            f"{', '.join(map(str, VERSIONS))}, whole numbers)",
            number,
        )
    exported = obj.get("exported")
    if exported is not None and not (isinstance(exported, str) and is_timestamp(exported)):
        raise SessionFileError(f"header field 'exported' is {short(exported)}, not a time", number)
    if version == 1:
        if "counts" in obj:
            raise SessionFileError("a version 1 header has no counts", number)
        return None
    counts = obj.get("counts")
    if not isinstance(counts, dict) or set(counts) != set(COUNTED):
        raise SessionFileError(
            f"header counts are {short(counts)}, not an object of {', '.join(COUNTED)}", number
        )
    for key in COUNTED:
        n = counts[key]
        if type(n) is not int or not 0 <= n <= INT_MAX:
            raise SessionFileError(f"header count {key} is {short(n)}", number)
    return dict(counts)


def check_counts(stated: dict[str, int] | None, held: dict[str, int]) -> None:
    """A file whose header states other counts than it holds was cut short (at a line
    boundary, so every line parses) or had records added or removed."""
    if stated is None or stated == held:
        return
    raise SessionFileError(
        f"the file holds {_counted(held)} where its header states {_counted(stated)}: "
        "it is incomplete or was edited"
    )


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {counts[k]}" for k in COUNTED)


def check_record(kind: str, obj: dict[str, Any], number: int) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for name, types in FIELDS[kind].items():
        if name not in obj:
            if (kind, name) in OPTIONAL:
                continue
            raise SessionFileError(f"{kind} record is missing {name!r}", number)
        value = obj[name]
        # bool is an int to Python, never to us.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise SessionFileError(f"{kind} field {name!r} has the wrong type", number)
        if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            raise SessionFileError(f"{kind} field {name!r} is out of range", number)
        if not (kind == "kv_snapshot" and name == "data"):  # checked as base64
            _check_value(value, f"{kind} field {name!r}", number)
        choices = CHOICES.get((kind, name))
        if choices is not None and value not in choices:
            raise SessionFileError(
                f"{kind} field {name!r} is {short(value)}, not one of {choices}", number
            )
        if name in TIMESTAMPS and not is_timestamp(value):
            raise SessionFileError(
                f"{kind} field {name!r} is {short(value)}, not a time such as {utc_now()!r}",
                number,
            )
        record[name] = value
    if kind == "session":
        _check_session(record, number)
    ids = record.get("token_ids") if kind == "message" else None
    if ids is not None and not all(type(i) is int and 0 <= i <= INT_MAX for i in ids):
        raise SessionFileError("message field 'token_ids' holds what is not a token id", number)
    return record


def kv_part_data(record: dict[str, Any], seen: int, size: int, parts: int, number: int) -> bytes:
    """The bytes of a checked kv_snapshot record, the next after `seen` parts of `parts`
    (`size` bytes in all) read before it."""
    part = record["part"]
    if part != seen or (seen and (record["size"] != size or record["parts"] != parts)):
        raise SessionFileError(f"kv_snapshot part {part} is out of order", number)
    if record["parts"] < 1 or part >= record["parts"] or record["size"] < 0:
        raise SessionFileError(
            f"kv_snapshot part {part} of {record['parts']} ({record['size']} bytes) is impossible",
            number,
        )
    try:
        return base64.b64decode(record["data"], validate=True)
    except ValueError:  # binascii.Error, or a character that is not ASCII
        raise SessionFileError("kv_snapshot data is not base64", number) from None


def _check_session(record: dict[str, Any], number: int) -> None:
    """The id names the KV snapshot file, so it must be exactly of the store's own form;
    the name must be one the store would accept from a user."""
    if not is_session_id(record["id"]):
        raise SessionFileError(
            f"session id {short(record['id'])} is not a session id (s- and 6 hex digits)",
            number,
        )
    if record["name"] is not None:
        name = record["name"]
        try:
            _check_name(name)
        except SessionError as e:  # its message quotes the name: keep that short
            raise SessionFileError(str(e).replace(repr(name), short(name)), number) from None


def _check_value(value: Any, what: str, number: int) -> None:
    """Every string valid UTF-8 (JSON can spell a lone surrogate, SQLite cannot store
    one), every number finite (NaN and Infinity are not JSON), nesting at most
    MAX_NESTING. Iterative, so depth costs no stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, what, number)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise SessionFileError(f"{what} holds {item} (not a finite number)", number)
        elif isinstance(item, (dict, list)):
            if depth >= MAX_NESTING:
                raise SessionFileError(f"{what} is nested more than {MAX_NESTING} deep", number)
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_text(key, what, number)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def _check_text(text: str, what: str, number: int) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SessionFileError(
            f"{what} is not valid UTF-8 text (it has a lone surrogate)", number
        ) from None


def finite(value):
    """`value` with every float that is not finite replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
