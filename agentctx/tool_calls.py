"""Tool calls in a model's text, in the forms real models write, and the streaming filter
that keeps their markup off the screen.

A call is `{"name": ..., "arguments": {...}}`; "parameters" or "args" may stand for
"arguments", the arguments may be a JSON-encoded string or written flat beside the name, and
the OpenAI wrapper `{"type": "function", "function": {...}}` is unwrapped. A message may hold
several calls, in any of these forms:
- tagged: `<tool_call>...</tool_call>` (Qwen2.5, Qwen3, Hermes), also with the closing tag
  missing or the JSON fenced inside the tags, or after `<|python_tag|>` (Llama 3.x);
- fenced: a ```json, ```tool_call or bare ``` block holding a call or a list of calls;
- bare: JSON objects starting a line, as the whole message or after some prose (Llama 3.x
  writes them so, several separated by `;`).
JSON with trailing commas, single quotes, Python's True/False/None or closing brackets
missing at the end is repaired.

Tagged text is a call whatever it holds (a name that is no tool, or JSON that does not
parse, gets an error the model can read). Untagged JSON is a call when it names an offered
tool, or when the whole message is nothing but call-shaped JSON: a code block in an answer
that shows some other JSON stays part of the answer. The text before the first call is the
step's visible content; what follows a call (often an invented result) is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from agentctx.lenient_json import (
    json_error,
    json_run,
    load_json,
    next_value,
    value_end,
)

# why a call could not run as written (None: it ran, or the tool itself refused it)
UNPARSED = "unparsed"  # no name and arguments object could be read
UNKNOWN_TOOL = "unknown_tool"
BAD_ARGUMENTS = "bad_arguments"  # the arguments do not fit the tool's schema

_OPEN_TAGS = ("<tool_call>", "<|python_tag|>")
_CLOSE_TAG = "</tool_call>"
_TAGGED = re.compile(r"(<tool_call>|<\|python_tag\|>)(.*?)(?=</tool_call>|<tool_call>|\Z)", re.S)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n`]*\n?(.*?)(?:```|\Z)", re.S)
_CALL_LANGS = frozenset({"", "json", "json5", "jsonc", "tool_call", "tool_code", "tool", "js"})
# a JSON object, or a list of them, starting a line (bare calls); group "b" is its bracket
_LINE_JSON = re.compile(r"^[ \t]*(?P<b>\{(?=\s*(?:[\"']|\Z))|\[(?=\s*(?:\{|\Z)))", re.M)
_ARG_KEYS = ("arguments", "parameters", "args")
_NAME_KEYS = ("name", "type", "id")  # what a flat call holds besides its arguments


@dataclass
class ToolCallRecord:
    name: str
    arguments: dict[str, Any]
    result: str | None = None
    error: str | None = None  # the call could not be parsed or the tool refused it
    problem: str | None = None  # UNPARSED, UNKNOWN_TOOL or BAD_ARGUMENTS: a malformed call
    looping: bool = False  # the model asks again for what it has (agentctx.agent.check_calls)
    repaired_from: str | None = None  # the name written, where another tool's arguments ran

    @property
    def output(self) -> str:
        if self.error is not None:
            return f"error: {self.error}"
        # a call stored before it ran, whose turn was interrupted: no result to show
        return self.result if self.result is not None else "error: the call did not finish"

    def label(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
        written = f" (written as {self.repaired_from})" if self.repaired_from else ""
        return f"{self.name}({args}){written}"


@dataclass
class CallSpan:
    """Where a call (or a group of calls) sits in the text, and what it asked for."""

    start: int
    end: int
    calls: list[ToolCallRecord]


def parse_tool_calls(
    text: str, fmt: str | None, tools: Collection[str] | None = None
) -> tuple[str, list[ToolCallRecord]]:
    """Split a step's text into (visible content, tool calls). `fmt` None: the template
    takes no tools, so nothing is a call. `tools`: the offered names (None: any name)."""
    if fmt is None:
        return text, []
    spans = find_calls(text, tools)
    if not spans:
        return text, []
    return text[: spans[0].start].rstrip(), [c for s in spans for c in s.calls]


def find_calls(text: str, tools: Collection[str] | None = None) -> list[CallSpan]:
    """The calls in text, in order (see the module's docstring for what counts)."""
    spans: list[CallSpan] = []
    taken: list[tuple[int, int]] = []  # tagged regions and every fenced block
    for m in _TAGGED.finditer(text):
        end = m.end()
        if text.startswith(_CLOSE_TAG, end):
            end += len(_CLOSE_TAG)
        spans.append(CallSpan(m.start(), end, _tagged_calls(m.group(2))))
        taken.append((m.start(), end))
    candidates: list[tuple[CallSpan, bool]] = []  # (span, whether it names an offered tool)
    for m in _FENCE.finditer(text):
        if _inside(m.start(), taken):
            continue
        taken.append((m.start(), m.end()))
        body = m.group(2).strip()
        if m.group(1).lower() in _CALL_LANGS and body[:1] in ("{", "["):
            group = _untagged_calls(body, tools)
            if group is not None:
                candidates.append((CallSpan(m.start(), m.end(), group[0]), group[1]))
    pos = 0
    while (m := _LINE_JSON.search(text, pos)) is not None:
        start = m.start("b")
        if _inside(start, taken):
            pos = start + 1
            continue
        end, values = json_run(text, start)
        calls = _calls_of(values, tools)
        if calls is not None:
            candidates.append((CallSpan(m.start(), end, calls[0]), calls[1]))
        pos = end if values else start + 1
    if candidates:
        only_calls = _only_calls(text, [s for s in spans] + [c for c, _ in candidates])
        spans += [span for span, offered in candidates if offered or only_calls]
    return sorted(spans, key=lambda s: s.start)


def _inside(pos: int, regions: list[tuple[int, int]]) -> bool:
    return any(a <= pos < b for a, b in regions)


def _only_calls(text: str, spans: list[CallSpan]) -> bool:
    """Whether text holds nothing but these spans (and separators between them)."""
    rest, last = [], 0
    for s in sorted(spans, key=lambda s: s.start):
        rest.append(text[last : max(s.start, last)])
        last = max(last, s.end)
    tail = text[last:].lstrip(" \t\r\n;,")
    if tail[:1] in ("{", "[") and not value_end(tail, 0)[1]:
        tail = ""  # a last call cut off (the step ran out of tokens): no answer text
    rest.append(tail)
    return not "".join(rest).replace(_CLOSE_TAG, "").strip(" \t\r\n;,")


def _tagged_calls(body: str) -> list[ToolCallRecord]:
    """Calls inside tags: every JSON value is a call, whatever its name."""
    body = body.strip()
    fenced = _FENCE.fullmatch(body)
    if fenced:
        body = fenced.group(2).strip()
    values, first_error = [], None
    pos = 0
    while (start := next_value(body, pos)) is not None:
        end, found = json_run(body, start)
        if not found:
            first_error = first_error or json_error(body[start:end])
        values += found
        pos = max(end, start + 1)
    if not values:
        error = first_error or json_error(body)
        return [ToolCallRecord("?", {}, error=error, problem=UNPARSED)]
    calls = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            calls.append(_call_of(item))
    return calls


def _untagged_calls(body: str, tools) -> tuple[list[ToolCallRecord], bool] | None:
    end, values = json_run(body, 0)
    if body[end:].strip():
        return None  # the block holds more than JSON: an answer's code
    return _calls_of(values, tools)


def _calls_of(values: list, tools) -> tuple[list[ToolCallRecord], bool] | None:
    """Untagged values as calls, if every one is call-shaped; and whether one names an
    offered tool."""
    items = [item for v in values for item in (v if isinstance(v, list) else [v])]
    if not items or not all(_call_shaped(item, tools) for item in items):
        return None
    calls = [_call_of(item) for item in items]
    offered = tools is None or any(c.name in tools for c in calls)
    return calls, offered


def _unwrap(item: Any) -> Any:
    if isinstance(item, dict) and isinstance(item.get("function"), dict) and "name" not in item:
        return item["function"]
    return item


def _call_shaped(item: Any, tools: Collection[str] | None) -> bool:
    """A name and its arguments; a flat call ({"name": "read_file", "path": "a.py"}) only
    with an offered name, since answers show JSON with a "name" too."""
    item = _unwrap(item)
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return False
    return any(key in item for key in _ARG_KEYS) or tools is None or item["name"] in tools


def _call_of(item: Any) -> ToolCallRecord:
    item = _unwrap(item)
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return ToolCallRecord("?", {}, error='a tool call needs a "name" string', problem=UNPARSED)
    name = item["name"]
    key = next((k for k in _ARG_KEYS if k in item), None)
    if key is None:
        args: Any = {k: v for k, v in item.items() if k not in _NAME_KEYS}
    else:
        args = item[key]
    if isinstance(args, str):  # some models send the arguments JSON-encoded
        try:
            args = load_json(args) if args.strip() else {}
        except ValueError:
            return ToolCallRecord(
                name, {}, error="the arguments are not valid JSON", problem=UNPARSED
            )
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCallRecord(
            name, {}, error="the arguments must be a JSON object", problem=UNPARSED
        )
    return ToolCallRecord(name, args)


# -- streaming ----------------------------------------------------------------------------


class VisibleText:
    """What of a streaming step to show: the text before its first tool call. Text that
    may start a call (a tag, a fenced JSON block, a JSON value starting a line) is held back
    until it is complete and find_calls decides; an ordinary code block is shown as it
    streams. `end(content)` gives what is left to show once the step's content is known."""

    def __init__(self, fmt: str | None, tools: Collection[str] | None = None) -> None:
        self.fmt = fmt
        self.tools = tools
        self.text = ""
        self.shown = 0
        self.pos = 0  # text before pos is decided: no call starts there
        self.hidden = False

    def feed(self, delta: str) -> str:
        if self.hidden or not delta:
            return ""
        self.text += delta
        if self.fmt is None:
            return self._show(len(self.text))
        out = []
        while True:
            step = self._advance()
            out.append(step[0])
            if not step[1]:
                return "".join(out)

    def end(self, content: str) -> str:
        """The rest of content not yet shown (content: the step's parsed content)."""
        done = self.text[: self.shown]
        if self.shown < len(content) and content.startswith(done):
            self.shown = len(content)
            return content[len(done) :]
        return ""

    def _advance(self) -> tuple[str, bool]:
        """Show what is decided; (the text shown, whether to look again)."""
        text, pos = self.text, self.pos
        starts = [k for k in (text.find(t, pos) for t in _OPEN_TAGS) if k >= 0]
        tag = min(starts) if starts else -1
        fence = text.find("```", pos)
        line = _LINE_JSON.search(text, pos)
        first = min(k for k in (tag, fence, line.start("b") if line else -1, len(text)) if k >= 0)
        if first == len(text):
            return self._show(self._hold_from(pos)), False
        if first == tag:
            self.hidden = True
            return self._show(tag), False
        if first == fence:
            return self._fence(fence)
        return self._decide(line.start(), *value_end(text, line.start("b")))

    def _fence(self, start: int) -> tuple[str, bool]:
        text = self.text
        m = _FENCE.match(text, start)
        info_end = text.find("\n", start)
        close = text.find("```", info_end + 1) if info_end >= 0 else -1
        if info_end < 0:
            return self._show(start), False  # the fence's language is not known yet
        body = text[info_end + 1 : close if close >= 0 else len(text)].lstrip()
        if m.group(1).lower() in _CALL_LANGS and body[:1] in ("", "{", "["):
            if close < 0:
                return self._show(start), False  # maybe a call: hold it
            return self._decide(start, close + 3, True)
        # an ordinary code block: show it as it streams; what it holds is no call
        if close < 0:
            return self._show(len(text) - _partial_suffix(text, "```")), False
        self.pos = close + 3
        return self._show(self.pos), True

    def _decide(self, start: int, end: int, closed: bool) -> tuple[str, bool]:
        if not closed:
            return self._show(start), False  # still streaming
        if any(s.start >= start for s in find_calls(self.text[:end], self.tools)):
            self.hidden = True
            return self._show(start), False
        self.pos = end
        return self._show(end), True

    def _hold_from(self, pos: int) -> int:
        """Where the undecided tail starts: a partial tag or fence, or a last line that is
        blank so far (a JSON value may follow its indent)."""
        text = self.text
        cut = len(text)
        for marker in (*_OPEN_TAGS, "```"):
            cut = min(cut, len(text) - _partial_suffix(text, marker))
        line_start = text.rfind("\n") + 1
        if not text[line_start:].strip(" \t"):
            cut = min(cut, line_start)
        return max(cut, pos, self.shown)

    def _show(self, upto: int) -> str:
        out = self.text[self.shown : upto]
        self.shown = max(self.shown, upto)
        return out


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
