"""File names as text for the model, and back: printable, and naming exactly one file."""

from __future__ import annotations

import os
import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def show_path(path: str) -> str:
    """A file name as text for the model: printable, and naming exactly one file.

    Bytes that are not UTF-8 (os.fsdecode keeps them as surrogates, which no tokenizer
    takes) become \\xNN, other unprintable characters \\xNN, \\uNNNN or \\UNNNNNNNN, and a
    backslash is doubled. unescape reads this form back, so every tool taking a path
    (through repo_files.confine) finds the file.
    """
    if path.isprintable() and "\\" not in path:
        return path
    return "".join(
        "\\\\" if char == "\\" else char if char.isprintable() else _escape(char) for char in path
    )


def printable(text: str) -> str:
    """text with unprintable characters escaped as show_path does, for a one-line message."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def no_surrogates(text: str) -> str:
    """text with any surrogate (an undecodable byte, or a lone half of a pair) escaped."""
    return _SURROGATE.sub(lambda match: _escape(match.group()), text)


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"  # a byte os.fsdecode could not decode
    if code < 0x80:
        return f"\\x{code:02x}"  # the same byte in UTF-8, so \xNN means one byte either way
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


# show_path's escapes, then git's quoting of unusual names: "\351" for a byte, "\t" for a tab.
_ESCAPE = re.compile(
    r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|([0-7]{3})|([\\\"abtnvfr]))"
)
_GIT_ESCAPES = dict(zip('\\"abtnvfr', '\\"\a\b\t\n\v\f\r', strict=True))


def unescape(text: str) -> str | None:
    """The file name that text shows, or None where text is not in that form."""
    if "\\" not in text:
        return text
    out = bytearray()
    at = 0
    try:
        while (start := text.find("\\", at)) >= 0:
            out += os.fsencode(text[at:start])
            match = _ESCAPE.match(text, start)
            if match is None:
                return None  # a backslash that escapes nothing: a literal name
            byte, short, long, octal, quoted = match.groups()
            if byte or octal:
                out.append(int(byte, 16) if byte else int(octal, 8))  # over \377: ValueError
            elif short or long:
                out += chr(int(short or long, 16)).encode("utf-8")
            else:
                out += _GIT_ESCAPES[quoted].encode()
            at = match.end()
        out += os.fsencode(text[at:])
    except (UnicodeEncodeError, ValueError, OverflowError):
        return None  # a lone surrogate, or a code point past U+10FFFF
    return os.fsdecode(bytes(out))
