"""A session as a readable Markdown transcript: the questions and answers in order, each
tool call folded under the answer that made it (<details>), the packed repository or book
and the system prompt folded too. One way: JSON Lines (session_file.py) stays the format
that imports back."""

from __future__ import annotations

import re
from typing import IO

from sessions.store import SessionStore

QUESTION_MARK = "\nQuestion: "  # how a first turn's message ends after its packed context
ROLES = {"user": "You", "assistant": "agentctx", "tool": "Tool result"}


def fence(text: str) -> str:
    """`text` in a code fence longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}\n{text.rstrip()}\n{ticks}"


def folded(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def write_markdown(store: SessionStore, ref: str, fp: IO[str]) -> None:
    session = store.get(ref)
    messages = store.messages(session.id)
    calls: dict[int | None, list] = {}
    for call in store.tool_calls(session.id):
        calls.setdefault(call.message_id, []).append(call)
    title = session.title or session.name or session.id
    fp.write(f"# {_one_line(title)}\n\n")
    label = f"{session.id} ({session.name})" if session.name else session.id
    fp.write(f"- session: {label}\n- reads: {session.root} ({session.root_kind})\n"
             f"- model: {session.model}\n- started: {session.created}, last turn: "
             f"{session.updated}\n")  # fmt: skip
    for m in messages:
        fp.write("\n" + _message(m) + "\n")
        for call in calls.get(m.id, []):
            fp.write("\n" + _call(call) + "\n")


def _message(m) -> str:
    if m.role == "system":
        return folded("system prompt", fence(m.content))
    head = f"## {ROLES.get(m.role, m.role)}"
    if m.status != "complete":
        head += f" ({m.status})"
    text = m.content
    if m.role == "user" and QUESTION_MARK in text:
        context, question = text.rsplit(QUESTION_MARK, 1)
        tokens = f", {m.tokens:,} tokens" if m.tokens else ""
        return f"{head}\n\n{question}\n\n" + folded(f"packed context{tokens}", fence(context))
    return f"{head}\n\n{text}"


def _call(call) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in (call.arguments or {}).items())
    summary = f"tool: {_html(call.name)}({_html(args)})"
    if call.error:
        return folded(summary + " (error)", fence(call.error))
    return folded(summary, fence(call.result or ""))


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")[:300]
