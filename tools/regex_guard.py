"""Regular expressions from the model, matched within a time budget.

Python's `re` backtracks without limit: `(a|aa)+$` on a line of forty a's, or `(\\w+\\s?)*$`
over a repository, runs for hours, and Ctrl-C waits for it. A pattern is checked with
Python's own parser (so the syntax is Python's), then matched by the `regex` module, whose
searches take a timeout. The budget grows with the text searched, so a large repository
is not cut short by a pattern that is merely linear, while a backtracking one stops within
about a second of CPU time and the model reads `error: pattern too slow`.
"""

from __future__ import annotations

import time
from typing import Any

import regex

from tools.errors import PatternError

try:  # Python's regex parser: re._parser since 3.11, sre_parse before
    from re import _constants as sre_constants
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

# No model writes a longer pattern; a 5 MB one took 15 s to compile.
MAX_PATTERN_CHARS = 1000
# `regex` unrolls counted repeats when it compiles: (a{1000}){1000} takes seconds and
# ((a{1000}){1000}){1000} gigabytes. Patterns whose unrolled size passes this are refused;
# 20,000 compiles in about 40 ms.
MAX_UNROLLED = 20_000
# CPU seconds of matching the searches of one tool call may use, plus this much per
# character searched (0.25 us: a linear pattern runs at 10-100 MB/s, 0.01-0.1 us a
# character, so only a backtracking one runs out; at 1 us a pattern backtracking ~1 us a
# character, `(\w+\s?)*$`, ran 4 s over this 4.5 MB repository without being stopped).
# CPU time, as `regex` counts its timeout: a loaded machine is no reason to cut a search
# short.
BASE_SECONDS = 0.5
SECONDS_PER_CHAR = 0.25e-6

_REPEATS = tuple(
    getattr(sre_constants, name)
    for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
    if hasattr(sre_constants, name)
)


class GuardedPattern:
    """A compiled pattern whose searches share one time budget: one per tool call."""

    def __init__(self, compiled: Any, source: str):
        self._compiled = compiled
        self.pattern = source
        self._left = BASE_SECONDS

    def search(self, text: str) -> Any:
        return self._run(self._compiled.search, text)

    def match(self, text: str) -> Any:
        return self._run(self._compiled.match, text)

    def _run(self, method: Any, text: str) -> Any:
        self._left += len(text) * SECONDS_PER_CHAR
        if self._left <= 0:
            raise too_slow(self.pattern)
        start = time.thread_time()
        try:
            return method(text, timeout=self._left)
        except TimeoutError:
            raise too_slow(self.pattern) from None
        finally:
            self._left -= time.thread_time() - start


def compile_guarded(
    pattern: str, ignore_case: bool = False, max_chars: int = MAX_PATTERN_CHARS
) -> GuardedPattern:
    """The pattern checked and compiled, or a PatternError with one line for the model.
    max_chars: more for a pattern the tools made (a glob's translation), not the model."""
    if not isinstance(pattern, str):
        raise PatternError(f"the pattern must be a string, got {type(pattern).__name__}")
    if len(pattern) > max_chars:
        raise PatternError(f"pattern too long: {len(pattern):,} characters, limit {max_chars:,}")
    shown = _shown(pattern)
    flags = sre_constants.SRE_FLAG_IGNORECASE if ignore_case else 0
    try:
        parsed = sre_parse.parse(pattern, flags)
        size = _unrolled(parsed)
    except sre_constants.error as exc:
        raise PatternError(f"invalid regex {shown}: {exc}") from None
    except RecursionError:
        raise PatternError(f"invalid regex {shown}: groups nest too deeply") from None
    except (OverflowError, MemoryError, ValueError, TypeError) as exc:
        # a{99999999999}: a count over what an int in C holds
        raise PatternError(f"invalid regex {shown}: {type(exc).__name__}: {exc}") from None
    if size > MAX_UNROLLED:
        raise PatternError(
            f"pattern too complex: {shown} unrolls to {size:,} steps, limit {MAX_UNROLLED:,}; "
            "use smaller repeat counts"
        )
    try:
        compiled = regex.compile(pattern, regex.IGNORECASE if ignore_case else 0)
    except RecursionError:
        raise PatternError(f"invalid regex {shown}: groups nest too deeply") from None
    except (regex.error, OverflowError, MemoryError, ValueError) as exc:
        raise PatternError(f"invalid regex {shown}: {exc}") from None
    return GuardedPattern(compiled, pattern)


def too_slow(pattern: str) -> PatternError:
    return PatternError(
        f"pattern too slow: {_shown(pattern)} backtracks without end; "
        "avoid nested or overlapping repeats such as (a+)+ or (a|aa)+"
    )


def _unrolled(parsed: Any) -> int:
    """The size of the pattern once counted repeats are written out, as `regex` does."""
    total = 0
    for op, av in parsed:
        if op in _REPEATS:
            low, high, item = av
            count = low if high == sre_constants.MAXREPEAT else high
            total += max(count, 1) * max(_unrolled(item), 1)
        else:
            total += 1 + sum(_unrolled(child) for child in _children(av))
        if total > MAX_UNROLLED:
            return total  # enough to refuse; stops a walk that would multiply further
    return total


def _children(av: Any) -> list[Any]:
    """The sub-patterns inside an opcode's argument (groups, branches, lookarounds)."""
    if isinstance(av, sre_parse.SubPattern):
        return [av]
    if isinstance(av, (tuple, list)):
        return [child for item in av for child in _children(item)]
    return []


def _shown(pattern: str, limit: int = 80) -> str:
    text = repr(pattern)
    return text if len(text) <= limit else text[: limit - 1] + "…"
