"""Text folded for matching: "Borodinó" and "BORODINO" both become "borodino".

NFKD splits an accented letter into its base letter and combining marks, which are then
dropped; a few letters that NFKD leaves whole (ø, ł, ß, æ...) get their usual Latin
spelling; casefold, not lower, so that "Straße" and "STRASSE" meet.
"""

from __future__ import annotations

import re
import unicodedata

# The combining marks that NFKD splits off Latin, Greek and Cyrillic letters (accents,
# cedillas, the breve of й), and the marks for symbols and half marks.
_MARKS = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+")
# Letters with no decomposition, spelled as an English text would spell them.
_SPELLED = str.maketrans(
    {
        "ø": "o", "Ø": "O", "ł": "l", "Ł": "L", "đ": "d", "Đ": "D", "ħ": "h", "Ħ": "H",
        "ı": "i", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ß": "ss", "þ": "th",
        "Þ": "TH", "ð": "d", "Ð": "D",
    }
)  # fmt: skip


def strip_accents(text: str) -> str:
    """text without accents, its case kept (case still splits camelCase names)."""
    if text.isascii():
        return text  # NFKD leaves ASCII as it is: the common case costs one check
    return _MARKS.sub("", unicodedata.normalize("NFKD", text)).translate(_SPELLED)


def fold(text: str) -> str:
    """text without accents, casefolded: the form both sides of a match are compared in."""
    return strip_accents(text).casefold()


def fold_with_offsets(text: str) -> tuple[str, list[int]]:
    """fold(text), and for each character of it the index in text it came from."""
    if text.isascii():
        return text.casefold(), list(range(len(text)))
    out: list[str] = []
    offsets: list[int] = []
    for index, char in enumerate(text):
        folded = fold(char)
        out.append(folded)
        offsets += [index] * len(folded)
    return "".join(out), offsets


def original_index(offsets: list[int], folded_index: int, length: int) -> int:
    """The index in the original text of a position in its folded form."""
    if folded_index < len(offsets):
        return offsets[folded_index]
    return length if not offsets else min(offsets[-1] + 1, length)
