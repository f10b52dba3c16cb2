"""A streamed chat completion as it arrives: server-sent events (`data: {chunk}` lines,
`data: [DONE]` at the end) turned into the answer's text, its tool calls (their deltas
assembled by index: the id and name come first, the arguments in pieces), the finish
reason and the usage chunk that `stream_options.include_usage` asks for."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


class StreamError(Exception):
    """The server sent an error event, or a line that is not a chunk."""


def sse_data(lines: Iterable[str]) -> Iterator[dict]:
    """The JSON objects of the stream's data lines, up to [DONE]."""
    for line in lines:
        if not line.startswith("data:"):
            continue  # blank separators, comments (": ping"), event: and id: lines
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        try:
            obj = json.loads(data)
        except ValueError:
            raise StreamError(f"the server sent a line that is not JSON: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise StreamError(f"the server sent a chunk that is not an object: {data[:200]!r}")
        if "error" in obj:
            err = obj["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise StreamError(f"the server failed mid-answer: {message}")
        yield obj


@dataclass
class StreamedCall:
    id: str | None = None
    name: str = ""
    arguments: str = ""  # JSON text, as the API sends it


@dataclass
class ChatAssembly:
    """What the chunks so far say."""

    content: str = ""
    calls: dict[int, StreamedCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict | None = None
    cache_n: int | None = None  # llama-server's timings.cache_n: the prompt tokens reused

    def feed(self, chunk: dict) -> str:
        """Take one chunk; returns the text it adds to the answer."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        timings = chunk.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
            self.cache_n = timings["cache_n"]
        added = ""
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                added += text
            for i, part in enumerate(delta.get("tool_calls") or []):
                self._call_delta(part, i)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        self.content += added
        return added

    def _call_delta(self, part: dict, position: int) -> None:
        index = part.get("index", position)
        call = self.calls.setdefault(index, StreamedCall())
        if part.get("id"):
            call.id = part["id"]
        fn = part.get("function") or {}
        if fn.get("name"):
            call.name += fn["name"]
        args = fn.get("arguments")
        if isinstance(args, str):
            call.arguments += args
        elif isinstance(args, dict):  # (some servers send the object itself)
            call.arguments += json.dumps(args)

    def tool_calls(self) -> list[StreamedCall]:
        return [self.calls[i] for i in sorted(self.calls)]

    @property
    def prompt_tokens(self) -> int | None:
        return (self.usage or {}).get("prompt_tokens")

    @property
    def completion_tokens(self) -> int | None:
        return (self.usage or {}).get("completion_tokens")

    @property
    def cached_tokens(self) -> int | None:
        """usage.prompt_tokens_details.cached_tokens (vLLM, SGLang, agentctx serve), else
        llama-server's timings in the usage chunk; None when the server says nothing."""
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        if isinstance(details.get("cached_tokens"), int):
            return details["cached_tokens"]
        return self.cache_n
