"""JSON as models write it: strict JSON first, then a repaired copy (trailing commas, single
quotes, Python's True/False/None, closing brackets missing at the end); never NaN,
Infinity, a number too large for a float, or nesting past MAX_ARG_NESTING (what is parsed
is stored and exported, and a session file refuses them)."""

from __future__ import annotations

import json
import math
from typing import Any

MAX_ARG_NESTING = 50  # (a session file holds at most 100 levels: sessions.session_file)


def load_json(text: str) -> Any:
    """JSON as a model writes it: strict first, then repaired (trailing commas, single
    quotes, True/False/None, closing brackets missing at the end). Never NaN, Infinity or a
    number too large for a float, nor nesting past MAX_ARG_NESTING. Raises ValueError."""
    try:
        return _strict_json(text)
    except RecursionError as e:
        raise ValueError("nested too deep") from e
    except ValueError as strict_error:
        repaired = _repair(text)
        if repaired is None or repaired == text:
            raise
        try:
            return _strict_json(repaired)
        except (ValueError, RecursionError):
            raise strict_error from None


def json_error(text: str) -> str:
    try:
        load_json(text)
    except json.JSONDecodeError as e:
        return f"the tool call is not valid JSON ({e.msg})"
    except ValueError as e:  # NaN, 5,000-digit numbers, deep nesting
        return f"the tool call is not valid JSON ({e})"
    return "the tool call is not valid JSON"


def _strict_json(text: str) -> Any:
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    data = json.loads(text, parse_constant=refuse)
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_ARG_NESTING:
            raise ValueError(f"nested more than {MAX_ARG_NESTING} deep")
        if isinstance(value, dict):
            stack += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value]
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError("a number too large is not JSON")  # 1e999 parses as inf
    return data


_WORDS = {"True": "true", "False": "false", "None": "null"}


def _repair(text: str) -> str | None:
    """text with Python-isms and a missing tail fixed, or None where a string is cut off."""
    out: list[str] = []
    closers: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            j = _string_end(text, i)
            if j is None:
                return None  # a string cut off: its value is unknown
            out.append(text[i:j] if ch == '"' else f'"{_requote(text[i + 1 : j - 1])}"')
            i = j
            continue
        if ch in "{[":
            closers.append("}" if ch == "{" else "]")
        elif ch in "}]":
            _drop_trailing_comma(out)
            if closers:
                closers.pop()
        elif ch.isalpha() or ch == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            out.append(_WORDS.get(word, word))
            i = j
            continue
        out.append(ch)
        i += 1
    _drop_trailing_comma(out)
    out += reversed(closers)
    return "".join(out)


def _requote(inner: str) -> str:
    """A single-quoted string's body as a double-quoted one's."""
    out, i = [], 0
    while i < len(inner):
        ch = inner[i]
        if ch == "\\" and i + 1 < len(inner):
            nxt = inner[i + 1]
            out.append("'" if nxt == "'" else ch + nxt)
            i += 2
            continue
        out.append('\\"' if ch == '"' else ch)
        i += 1
    return "".join(out)


def _drop_trailing_comma(out: list[str]) -> None:
    k = len(out) - 1
    while k >= 0 and out[k].isspace():
        k -= 1
    if k >= 0 and out[k] == ",":
        del out[k]


def _string_end(text: str, i: int) -> int | None:
    """The index after the string that starts at text[i] (a quote), or None if unclosed."""
    quote, j, n = text[i], i + 1, len(text)
    while j < n:
        if text[j] == "\\":
            j += 2
        elif text[j] == quote:
            return j + 1
        else:
            j += 1
    return None


def value_end(text: str, start: int) -> tuple[int, bool]:
    """Where the bracketed value at text[start] ('{' or '[') ends, and whether it closed:
    (len(text), False) for a value cut off or whose closing brackets were forgotten."""
    depth, j, n = 0, start, len(text)
    while j < n:
        ch = text[j]
        if ch in "\"'":
            end = _string_end(text, j)
            if end is None:
                return n, False
            j = end
            continue
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return j + 1, True
        j += 1
    return n, False


def json_run(text: str, start: int) -> tuple[int, list]:
    """The JSON values from text[start], one after another with only whitespace, ';' or ','
    between them: (the end of the last one read, the values). A value that does not parse
    ends the run; if it is the first, the values are [] and the end is where it ends."""
    values, last_end, pos, n = [], start, start, len(text)
    while pos < n and text[pos] in "{[":
        end, _ = value_end(text, pos)
        try:
            value = load_json(text[pos:end])
        except ValueError:
            if not values:
                return end, []
            break
        values.append(value)
        last_end = pos = end
        while pos < n and text[pos] in " \t\r\n;,":
            pos += 1
    return last_end, values


def next_value(text: str, pos: int) -> int | None:
    starts = [k for k in (text.find("{", pos), text.find("[", pos)) if k >= 0]
    return min(starts) if starts else None
