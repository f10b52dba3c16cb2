"""The agent loop: one turn may call tools before it answers.

A model whose chat template takes `tools` gets the read-only tools of the session's root
(repository or book) with their JSON schemas. Each step renders the conversation, streams
the model's text, and parses the tool calls in it (agentctx.tool_calls: the forms real
models write); the calls run, their results go back as `tool` messages, and the next step
continues. A step without a tool call is the answer. A call that names no offered tool, or
whose arguments do not fit the tool's schema, gets an error result that says what the
tools take, and the loop goes on. The number of tool steps is capped; at the cap the model
is told to answer from what it has.

Models whose template has no tools answer from the packed context in one step.

A template speaks one of two formats, which say how a call is rendered back and how the
model is told to write one:
- "hermes": `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5, Qwen3,
  Hermes);
- "json": a bare JSON object `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>` (Llama 3.1 and 3.2).
Either format's calls parse whichever form the model writes them in.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from agentctx.tool_calls import (  # noqa: F401  (the loop's names, in one place)
    BAD_ARGUMENTS,
    UNKNOWN_TOOL,
    UNPARSED,
    ToolCallRecord,
    VisibleText,
    parse_tool_calls,
)

DEFAULT_MAX_STEPS = 6
MAX_RESULT_CHARS = 12_000  # one tool result; the rest is cut with a note
LIMIT_NOTE = "(tool step limit reached: answer now from what you have, without calling tools)"


@dataclass
class ToolStep:
    """One step that called tools: the text the model wrote before the calls, and the calls;
    `after`: a user message sent after their results (after_step), or None."""

    content: str
    calls: list[ToolCallRecord] = field(default_factory=list)
    after: str | None = None


# Added to the system prompt when the model is offered tools, with an example call in the
# template's format (the session's stored system message is the same either way; each
# turn adds this again, so a follow-up's prompt still extends the last one's).
TOOL_PROMPTS = {
    "repo": (
        "When the files given lack what the question needs (a function's body, a file that "
        "was left out or cut off), call a tool first: read_file reads a file, grep finds "
        "where a name is defined or used. Only the tools listed below exist; the "
        "repository's own functions are not tools."
    ),
    "book": (
        "When the chapters given lack what the question needs, call a tool first: "
        "search_book finds a phrase, read_chapter and read_lines read the text."
    ),
}
TOOL_EXAMPLES = {
    "repo": ("grep", {"pattern": "a_name"}),
    "book": ("search_book", {"query": "a phrase"}),
}


def tool_format(template: str | None) -> str | None:
    """Which tool-call format a chat template speaks; None if it takes no tools."""
    if not template or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    return "json"


def engine_tool_format(engine) -> str | None:
    tokenizer = getattr(engine, "tokenizer", None)
    return tool_format(getattr(tokenizer, "chat_template", None))


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


def format_call(name: str, arguments: dict[str, Any], fmt: str | None) -> str:
    """A call as the template's format writes it."""
    if fmt == "json":
        return json.dumps({"name": name, "parameters": arguments})
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def search_hint(
    name: str, offered: tuple[str, ...], fmt: str | None, root=None, read=frozenset()
) -> str:
    """For a call of a tool that does not exist: where it is a function of the repository
    whose file was read already (an unread one is read instead: _read_instead), that it
    cannot run and the answer is in what was read; else how to find the name with a real
    tool. `read`: the paths read so far."""
    name = name.rsplit(".", 1)[-1]
    if not re.fullmatch(_NAME, name):
        return ""
    if root is not None and "read_file" in offered:
        found = _definition(root, name)
        if found is not None and found[0] in read:
            path, line = found
            where = (
                f"{name} is defined in the repository ({path}:{line}), not a tool: it cannot be run"
            )
            return f"{where}. {READ_ALREADY}"
    if "grep" in offered:
        call = format_call("grep", {"pattern": name}, fmt)
    elif "search_book" in offered:
        call = format_call("search_book", {"query": name.replace("_", " ")}, fmt)
    else:
        return ""
    return f"If {name} is a name in the text, find it with {call}"


_DEFINES = r"^\s*(?:(?:async|export|pub|public|static)\s+)*(?:def|class|function|func|fn)\s+"


def _definition(root, name: str) -> tuple[str, int] | None:
    """The first line of the repository that defines name (def, class, function, ...)."""
    from tools.errors import ToolError
    from tools.grep import grep

    try:
        found = grep(root, _DEFINES + re.escape(name) + r"\b", max_matches=1)
    except (ToolError, OSError):  # a book's root is a file; an unreadable tree
        return None
    m = re.match(r"(.+?):(\d+): ", found)
    return (m[1], int(m[2])) if m else None


def read_paths(calls: list[ToolCallRecord]) -> frozenset[str]:
    """The files that read_file calls read."""
    return frozenset(
        os.path.normpath(str(c.arguments.get("path")))
        for c in calls
        if c.name == "read_file" and c.error is None and c.result is not None
    )


def check_calls(
    step: ToolStep, offered: tuple[str, ...], fmt: str | None, root=None, earlier=()
) -> None:
    """Mark the calls that cannot run as written, with an error that says what to write:
    an unknown tool (the error lists the offered ones), arguments that do not fit the
    schema (it gives the tool's signature), or a call that did not parse. A call the turn
    already made (`earlier`) is not run again: the error says to use its result."""
    from tools.registry import argument_error, unknown_tool_error

    for call in step.calls:
        if call.problem == UNPARSED:
            example = format_call("read_file", {"path": "src/app.py"}, fmt)
            if "write a call as" not in call.error:
                call.error = f"{call.error}; write a call as {example}"
        elif call.error is None and call.name not in offered and _repair(call, offered):
            pass  # runs as the tool whose arguments it gave
        elif (
            call.error is None
            and call.name not in offered
            and _read_instead(call, offered, root, read_paths(list(earlier)))
        ):
            pass  # a function of the repository called as a tool: its code is read
        elif call.error is None and call.name not in offered:
            error = unknown_tool_error(call.name, offered)
            hint = search_hint(call.name, offered, fmt, root, read_paths(list(earlier)))
            call.error = f"{error}. {hint}".rstrip(" .")
            call.looping = hint.endswith(READ_ALREADY)
            call.problem = UNKNOWN_TOOL
        elif call.error is None:
            error = argument_error(call.name, call.arguments)
            if error is not None:
                call.error, call.problem = error, BAD_ARGUMENTS
            else:  # a small model loops on one call, whether it worked or failed
                before = next((c for c in reversed(earlier) if _same(call, c)), None)
                if before is not None and before.result is not None:
                    call.error, call.looping = REPEATED, True
                elif before is not None and before.error is not None:
                    first = before.error.split("\n\n")[0]
                    call.error, call.looping = REPEATED_ERROR.format(error=first), True
        earlier = [*earlier, call]


# Where a call's name is no tool but its arguments fit one, the most useful tool that takes
# them runs: the 0.5B and the 1.5B write {"name": "UsageError", "arguments": {"path":
# "click/core.py:3825"}} (the symbol they want as the name, read_file's arguments).
REPAIR_ORDER = ("read_file", "grep", "outline", "git_blame", "git_log", "git_show", "git_diff",
                "list_files", "read_chapter", "read_lines", "search_book", "chapters")  # fmt: skip


def _repair(call: ToolCallRecord, offered: tuple[str, ...]) -> bool:
    """Rename a call of an unknown tool to the first offered tool (REPAIR_ORDER) whose schema
    takes its arguments; no arguments, or arguments no tool takes, are not repaired."""
    from tools.registry import argument_error

    if not call.arguments:
        return False
    for name in REPAIR_ORDER:
        if name in offered and argument_error(name, call.arguments) is None:
            call.repaired_from, call.name = call.name, name
            return True
    return False


def _read_instead(call: ToolCallRecord, offered: tuple[str, ...], root, read) -> bool:
    """Turn a call of the repository's own function or class ("Context.find_root", with the
    arguments it would take) into a read of its definition, 40 lines from its first line,
    unless its file was read already in this turn (the caller then says to answer)."""
    name = call.name.rsplit(".", 1)[-1]
    if root is None or "read_file" not in offered or not re.fullmatch(_NAME, name):
        return False
    found = _definition(root, name)
    if found is None or found[0] in read:
        return False
    path, line = found
    call.repaired_from, call.name = call.name, "read_file"
    call.arguments = {"path": path, "start": line, "max_lines": 40}
    return True


_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,80}"
READ_ALREADY = "You have read its code: answer from it now, without tools"
REPEATED = (
    "this call was made before in this turn, and its result is above: answer from it now, "
    "or make a different call"
)


REPEATED_ERROR = (
    "this call was made before in this turn and failed ({error}): do not repeat it; "
    "make a different call, or answer from what is above"
)


def _same(a: ToolCallRecord, b: ToolCallRecord) -> bool:
    return a.name == b.name and a.arguments == b.arguments


def run_tools(
    root: str, step: ToolStep, output, last: bool, offered=None, fmt=None, earlier=()
) -> None:
    """Run the step's calls that can run; every call gets a result or an error.
    `earlier`: the turn's calls before this step."""
    from tools.registry import REPO_TOOLS, run_tool

    check_calls(step, tuple(offered or REPO_TOOLS), fmt, root, earlier)
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


NOT_RUN = "not run: no more tool calls in this turn; answer in words from the results above"


def refuse_calls(calls: list[ToolCallRecord], offered, fmt) -> list[ToolCallRecord]:
    """The calls of a step that had to be the answer: checked (so they are counted), then
    refused with NOT_RUN where they could have run."""
    check_calls(ToolStep("", calls), tuple(offered), fmt)
    for call in calls:
        if call.error is None:
            call.error = NOT_RUN
    return calls


def call_counts(calls: list[ToolCallRecord]) -> dict[str, int]:
    """A turn's tool calls for its usage record: made (every call the text held), parsed
    (a name and an arguments object could be read), succeeded (the tool ran and returned
    no error) and malformed (unparsed, an unknown tool, or arguments that fail the schema;
    the rest of the failures are the tools' own errors, such as a missing file)."""
    return {
        "tool_calls": len(calls),
        "tool_calls_parsed": sum(c.problem != UNPARSED for c in calls),
        "tool_calls_succeeded": sum(c.error is None and c.result is not None for c in calls),
        "tool_calls_malformed": sum(c.problem is not None for c in calls),
    } | _repaired_count(calls)


def _repaired_count(calls: list[ToolCallRecord]) -> dict[str, int]:
    """{"tool_calls_repaired": n} where n calls ran as another tool (_repair), else {}."""
    repaired = sum(c.repaired_from is not None for c in calls)
    return {"tool_calls_repaired": repaired} if repaired else {}


def with_tool_prompt(messages: list[dict], kind: str, fmt: str | None) -> list[dict]:
    """The conversation with the tool instructions added to its system message."""
    extra = TOOL_PROMPTS.get(kind, TOOL_PROMPTS["repo"])
    if not extra:
        return list(messages)
    if fmt != "hermes":
        # a hermes template (Qwen's) shows the call's form itself; an example on top of it
        # was copied into answers, the repository's names put where the tool's should be
        name, arguments = TOOL_EXAMPLES.get(kind, TOOL_EXAMPLES["repo"])
        extra = f"{extra} Write each call as {format_call(name, arguments, fmt)}."
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{extra}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": extra}, *messages]


# What the model is told after a step's results, as a user message of its own (a note
# inside the tool result did not move the 0.5B; this did: bench/tool_calls.py)
ANSWER_NOW = (
    "Answer the question from the tool results above, in words, without calling a tool. "
    "The question: {question}"
)
ANSWER_OR_CALL = (
    "If the tool results above hold what the question needs, answer it now, in words; "
    "if not, call another tool. The question: {question}"
)
NUDGE_EVERY_STEP = False


def question_of(messages: list[dict]) -> str:
    """The turn's question: the last user message, after its "Question: " when it holds a
    packed context (agentctx.ask.first_messages)."""
    last = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    head, sep, question = last.rpartition("\n\nQuestion: ")
    return question.strip() if sep else last.strip()


def after_step(step: ToolStep, question: str, last: bool) -> tuple[str | None, bool]:
    """(the user message to send after the step's results, whether the next step must be
    the answer). The last allowed step, or one whose every call loops (a call made before,
    a function called to run it after its file was read), is followed by ANSWER_NOW and
    an answer; with NUDGE_EVERY_STEP, any other step by ANSWER_OR_CALL."""
    if not question:
        return None, last
    if last or (step.calls and all(c.looping for c in step.calls)):
        return ANSWER_NOW.format(question=question), True
    if NUDGE_EVERY_STEP:
        return ANSWER_OR_CALL.format(question=question), False
    return None, False
