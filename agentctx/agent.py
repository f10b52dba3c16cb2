"""The agent loop: one turn may call tools before it answers.

A model whose chat template takes `tools` gets the read-only tools of the session's root
(repository or book) with their JSON schemas. Each step renders the conversation, streams
the model's text, and parses the tool calls in it; the calls run, their results go back as
`tool` messages, and the next step continues. A step without a tool call is the answer. The
number of tool steps is capped; at the cap the model is told to answer from what it has.

Models whose template has no tools answer from the packed context in one step.

Tool-call formats (the two families that local models use):
- "hermes": `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5, Qwen3,
  Hermes); text before the first call is shown as the step's content.
- "json": a bare JSON object `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>` (Llama 3.1 and 3.2; "arguments" is accepted too).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_STEPS = 6
MAX_RESULT_CHARS = 12_000  # one tool result; the rest is cut with a note
LIMIT_NOTE = "(tool step limit reached: answer now from what you have, without calling tools)"

_HERMES_OPEN = "<tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


@dataclass
class ToolCallRecord:
    name: str
    arguments: dict[str, Any]
    result: str | None = None
    error: str | None = None  # the call could not be parsed or the tool refused it

    @property
    def output(self) -> str:
        if self.error is not None:
            return f"error: {self.error}"
        # a call stored before it ran, whose turn was interrupted: no result to show
        return self.result if self.result is not None else "error: the call did not finish"

    def label(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
        return f"{self.name}({args})"


@dataclass
class ToolStep:
    """One step that called tools: the text the model wrote before the calls, and the calls."""

    content: str
    calls: list[ToolCallRecord] = field(default_factory=list)


def tool_format(template: str | None) -> str | None:
    """Which tool-call format a chat template speaks; None if it takes no tools."""
    if not template or "tools" not in template:
        return None
    if _HERMES_OPEN in template:
        return "hermes"
    return "json"


def engine_tool_format(engine) -> str | None:
    tokenizer = getattr(engine, "tokenizer", None)
    return tool_format(getattr(tokenizer, "chat_template", None))


def parse_tool_calls(text: str, fmt: str | None) -> tuple[str, list[ToolCallRecord]]:
    """Split a step's text into (visible content, tool calls). A call that cannot be parsed
    becomes a record with an error, so the model is told and can try again."""
    if fmt == "hermes":
        start = text.find(_HERMES_OPEN)
        if start < 0:
            return text, []
        calls = [_call_from_json(body) for body in _HERMES_CALL.findall(text[start:])]
        return text[:start].rstrip(), calls
    if fmt == "json":
        body = text.strip()
        if body.startswith(_PYTHON_TAG):
            body = body[len(_PYTHON_TAG) :].strip()
        if not body.startswith("{"):
            return text, []
        # Llama 3.x may separate several calls with ';'
        parts = [p for p in _split_json_objects(body)] or [body]
        calls = [_call_from_json(p) for p in parts]
        if all(c.error for c in calls) and '"name"' not in body:
            return text, []  # JSON that is no tool call: an answer
        return "", calls
    return text, []


def _split_json_objects(body: str) -> list[str]:
    """Top-level {...} objects in body (braces inside strings are skipped)."""
    out, depth, start, in_str, escape = [], 0, None, False, False
    for i, ch in enumerate(body):
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                out.append(body[start : i + 1])
    return out


def _strict_json(text: str):
    """json.loads without NaN or Infinity (JSON has neither; a stored call holding one could
    not be exported and imported again) and without nesting past MAX_ARG_NESTING."""

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
    return data


MAX_ARG_NESTING = 50  # (a session file holds at most 100 levels: sessions.session_file)


def _call_from_json(body: str) -> ToolCallRecord:
    try:
        data = _strict_json(body)
    except json.JSONDecodeError as e:
        return ToolCallRecord("?", {}, error=f"the tool call is not valid JSON ({e.msg})")
    except (ValueError, RecursionError) as e:  # NaN, 5,000-digit numbers, deep nesting
        return ToolCallRecord("?", {}, error=f"the tool call is not valid JSON ({e})")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCallRecord("?", {}, error='a tool call needs a "name" string')
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):  # some models send the arguments JSON-encoded
        try:
            args = _strict_json(args) if args.strip() else {}
        except (ValueError, RecursionError):  # (JSONDecodeError is a ValueError)
            return ToolCallRecord(data["name"], {}, error="the arguments are not valid JSON")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCallRecord(data["name"], {}, error="the arguments must be a JSON object")
    return ToolCallRecord(data["name"], args)


class VisibleText:
    """What of a streaming step to show: everything up to a tool call's markup. Holds back
    a tail that could be the start of the markup."""

    def __init__(self, fmt: str | None) -> None:
        self.fmt = fmt
        self.text = ""
        self.shown = 0
        self.hidden = False

    def feed(self, delta: str) -> str:
        if self.hidden or not delta:
            return ""
        self.text += delta
        if self.fmt == "hermes":
            cut = self.text.find(_HERMES_OPEN)
            if cut >= 0:
                self.hidden = True
                return self._show(cut)
            return self._show(len(self.text) - _partial_suffix(self.text, _HERMES_OPEN))
        if self.fmt == "json":
            head = self.text.lstrip()
            if not head:
                return ""
            if head.startswith("{") or head.startswith(_PYTHON_TAG):
                self.hidden = True
                return ""
            if _PYTHON_TAG.startswith(head):
                return ""
        return self._show(len(self.text))

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


def assistant_message(step: ToolStep) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": step.content,
        "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in step.calls
        ],
    }


def tool_messages(step: ToolStep) -> list[dict[str, Any]]:
    return [{"role": "tool", "name": c.name, "content": c.output} for c in step.calls]


def run_tools(root: str, step: ToolStep, output, last: bool) -> None:
    from tools.registry import run_tool

    for call in step.calls:
        output.tool_call(call)
        if call.error is None:
            result = run_tool(root, call.name, call.arguments)
            if result.startswith("error: "):
                call.error = result[len("error: ") :]
            else:
                if len(result) > MAX_RESULT_CHARS:
                    cut = len(result) - MAX_RESULT_CHARS
                    result = result[:MAX_RESULT_CHARS] + f"\n... {cut:,} more characters cut"
                call.result = result
        output.tool_result(call)
    if last and step.calls:
        tail = step.calls[-1]
        if tail.error is None:
            tail.result = f"{tail.result}\n\n{LIMIT_NOTE}"
        else:
            tail.error = f"{tail.error}\n\n{LIMIT_NOTE}"
