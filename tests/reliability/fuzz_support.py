"""Mutations for the fuzz tests: what hypothesis draws, applied to the lines of a session
file or to the JSON of a snapshot header.

Each run is derandomized (the same examples in every run, so a CI failure reproduces) and
draws at least EXAMPLES mutated inputs per target; the tests count the inputs they ran.
The tests draw through st.data(), never a strategy built from the file: hypothesis seeds a
derandomized run from the test and its strategies' reprs, and a file's temporary paths
and times would make every run's examples different.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = 300
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,  # nothing written into the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# JSON values, with the ones that broke readers before: huge and negative integers, floats
# that equal integers, NaN and infinity (json writes them as literals), bools, lone
# surrogates, numeric-looking strings, deep-ish nesting.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.sampled_from([0, 1, -1, 2, 16, 1 << 63, (1 << 63) - 1, -(1 << 63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1.0, 2.0, 0.0, -0.0, 1e100]),
    st.text(max_size=20),
    st.sampled_from(["", "0", "16", "-1", "1e3", " 16", "١٦", "\ud800", "\n", "F32", "I64",
                     "s-abcdef", "2024-05-01T12:00:00.000000+00:00", "00000000", "A" * 300]),
)  # fmt: skip
JSON = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
KEYS = st.one_of(st.sampled_from([""]), st.text(max_size=10))


def dump(value: Any) -> str:
    """JSON as a file may hold it (NaN and Infinity literals; a lone surrogate escaped)."""
    return json.dumps(value, allow_nan=True)


def mutate_lines(draw, lines: list[str]) -> tuple[str, str]:
    """(what was done, the mutated text) of 1 to 3 edits of a session file's lines; `draw`
    is hypothesis' data().draw."""
    lines, done = list(lines), []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(
            ["cut", "drop", "duplicate", "swap", "set", "delete", "bytes", "header"]
        ))  # fmt: skip
        n = len(lines)
        i = draw(st.integers(0, max(n - 1, 0)))
        if kind == "cut":
            text = "".join(lines)
            at = draw(st.integers(0, len(text)))
            lines = [text[:at]]
        elif n and kind == "drop":
            del lines[i]
        elif n and kind == "duplicate":
            lines.insert(draw(st.integers(0, n)), lines[i])
        elif n and kind == "swap":
            j = draw(st.integers(0, n - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif n and kind in ("set", "delete", "header"):
            i = 0 if kind == "header" else i
            lines[i] = _edit_object(draw, lines[i], kind)
        elif n:
            lines[i] = _edit_bytes(draw, lines[i])
        done.append(f"{kind}@{i}")
        lines = [line for line in lines if line]
    return " ".join(done), "".join(lines)


def _edit_object(draw, line: str, kind: str) -> str:
    try:
        obj = json.loads(line)
    except ValueError:
        return line
    if not isinstance(obj, dict) or not obj:
        return line
    keys = sorted(obj)
    if kind == "header":  # the fields a reader of the header decides on
        key = draw(st.sampled_from(["version", "counts", "format", "exported"]))
        if key == "counts" and isinstance(obj.get("counts"), dict) and draw(st.booleans()):
            inner = draw(st.sampled_from(sorted(obj["counts"]) + ["extra"]))
            obj["counts"][inner] = draw(JSON)
        else:
            obj[key] = draw(JSON)
    elif kind == "delete":
        del obj[draw(st.sampled_from(keys))]
    else:
        key = draw(st.one_of(st.sampled_from(keys), KEYS))
        obj[key] = draw(JSON)
    return dump(obj) + "\n"


def _edit_bytes(draw, line: str) -> str:
    # (bytes that are not UTF-8 travel in the text as surrogate escapes: see as_bytes)
    data = bytearray(as_bytes(line))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    how = draw(st.sampled_from(["flip", "insert", "delete"]))
    byte = draw(st.integers(0, 255))
    if how == "flip" and data:
        data[at] ^= byte or 1
    elif how == "insert":
        data[at:at] = bytes([byte])
    elif data:
        del data[at]
    return data.decode("utf-8", "surrogateescape")


def as_bytes(text: str) -> bytes:
    """The bytes of a mutated file's text."""
    return text.encode("utf-8", "surrogateescape")


def mutate_header(draw, header: dict[str, Any]) -> tuple[str, Any, bool]:
    """(what was done, the mutated header JSON, whether to recompute its checksum) of 1
    to 3 edits of a snapshot header, the checksum recomputed most of the time so that
    the edit reaches the checks after it."""
    header, done = json.loads(json.dumps(header)), []
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["meta", "meta", "meta", "kv", "token_ids", "top"]))
        target = header.get("__metadata__") if where == "meta" else header.get(where)
        if where == "top" or not isinstance(target, dict):
            key = draw(st.sampled_from(["__metadata__", "kv", "token_ids", "extra"]))
            if isinstance(header, dict):
                header[key] = draw(JSON)
            done.append(f"top.{key}")
            continue
        key = draw(st.one_of(st.sampled_from(sorted(target)), KEYS) if target else KEYS)
        how = draw(st.sampled_from(["set", "set", "delete", "number", "list"]))
        if how == "delete":
            target.pop(key, None)
        elif how == "number":  # a decimal string near the real one, as a metadata value
            target[key] = str(draw(st.integers(-2, 1 << 64)))
        elif how == "list" and isinstance(target.get(key), list):
            items = target[key]
            if items:
                items[draw(st.integers(0, len(items) - 1))] = draw(JSON)
        else:
            target[key] = draw(JSON)
        done.append(f"{where}.{key}:{how}")
    return " ".join(done), header, draw(st.integers(0, 9)) > 0
