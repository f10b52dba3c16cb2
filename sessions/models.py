"""The records the session store keeps: sessions, their messages, tool calls and manifests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sessions.errors import SessionError

ROOT_KINDS = ("repo", "book", "none")
ROLES = ("system", "user", "assistant", "tool")
STATUSES = ("complete", "interrupted", "error")


def _json(text: str | None, default: Any) -> Any:
    return default if text is None else json.loads(text)


def to_json(value: Any) -> str | None:
    """A value as the store's JSON text (None stays NULL)."""
    return None if value is None else json.dumps(value, ensure_ascii=False)


def check_choice(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise SessionError(f"unknown {what} {value!r} (expected one of {', '.join(allowed)})")


@dataclass
class Session:
    id: str
    name: str | None
    root: str | None
    root_kind: str
    model: str
    created: str
    updated: str
    title: str | None = None
    message_count: int = 0
    turns: int = 0  # questions asked
    first_question: str | None = None  # the first question's start, for lists
    settings: dict[str, Any] | None = None  # sampling settings changed by /set

    @property
    def label(self) -> str:
        """What a list calls the session: its title, else its first question, else its name."""
        question = " ".join((self.first_question or "").split())
        return self.title or question or self.name or ""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Session:
        return cls(
            id=row["id"],
            name=row["name"],
            root=row["root"],
            root_kind=row["root_kind"],
            model=row["model"],
            created=row["created"],
            updated=row["updated"],
            title=row.get("title"),
            message_count=row.get("message_count", 0),
            turns=row.get("turns", 0),
            first_question=row.get("first_question"),
            settings=_json(row.get("settings"), None),
        )


@dataclass
class Message:
    id: int
    session_id: str
    seq: int
    role: str
    content: str
    tokens: int | None
    status: str
    created: str
    # ttft_s, decode_tok_s, prompt_tokens, cached_tokens, ...
    timings: dict[str, Any] | None = None
    token_ids: list[int] | None = None  # an answer's generated ids, when its text is them

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Message:
        return cls(
            id=row["id"],
            session_id=row["session_id"],
            seq=row["seq"],
            role=row["role"],
            content=row["content"],
            tokens=row["tokens"],
            status=row["status"],
            created=row["created"],
            timings=_json(row["timings"], None),
            token_ids=_json(row.get("token_ids"), None),
        )


@dataclass
class ToolCall:
    id: int
    session_id: str
    message_id: int | None
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    result: str | None = None
    error: str | None = None
    created: str = ""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ToolCall:
        return cls(
            id=row["id"],
            session_id=row["session_id"],
            message_id=row["message_id"],
            name=row["name"],
            arguments=_json(row["arguments"], {}),
            result=row["result"],
            error=row["error"],
            created=row["created"],
        )


@dataclass
class Manifest:
    """What was put in the context for a turn: files as {path, tokens}, and the files
    left out as {path, tokens, reason}."""

    id: int
    session_id: str
    message_id: int | None
    commit_sha: str | None
    files: list[dict[str, Any]] = field(default_factory=list)
    omitted: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    created: str = ""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Manifest:
        return cls(
            id=row["id"],
            session_id=row["session_id"],
            message_id=row["message_id"],
            commit_sha=row["commit_sha"],
            files=_json(row["files"], []),
            omitted=_json(row["omitted"], []),
            tokens=row["tokens"],
            created=row["created"],
        )
