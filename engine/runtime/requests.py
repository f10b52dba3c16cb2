"""A request's bookkeeping: its sequence, detokenizer, events and statistics, and the
stream that hands its events to the caller."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.runtime.detokenizer import Detokenizer
from engine.runtime.sequence import Sequence

if TYPE_CHECKING:
    from engine.kv.session import EngineSession
    from engine.runtime.engine_loop import EngineLoop


@dataclass(slots=True)
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    completion_tokens: int = 0
    ttft_s: float = 0.0  # request start to first sampled token
    total_s: float = 0.0
    # speculative decoding (engine.spec.decoder.SpecStats): verification steps, drafted and
    # accepted tokens, proposer time; None when no step of the request speculated
    speculation: object | None = None

    @property
    def prefill_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def decode_tok_s(self) -> float:
        decode_s = self.total_s - self.ttft_s
        return (
            (self.completion_tokens - 1) / decode_s
            if self.completion_tokens > 1 and decode_s > 0
            else 0.0
        )

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.ttft_s if self.ttft_s > 0 else 0.0


@dataclass(slots=True)
class StreamEvent:
    kind: str  # "prefill" (progress), "token" (new text), "done"
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens in the cache so far
    prompt_tokens: int = 0
    finish_reason: str | None = None
    stats: GenerationStats | None = None


@dataclass(slots=True)
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats


class Request:
    def __init__(self, seq: Sequence, detok: Detokenizer | None):
        self.seq, self.detok = seq, detok
        self.events: deque[StreamEvent] = deque()
        self.cancelled = threading.Event()
        self.start = time.perf_counter()
        self.stats = GenerationStats(prompt_tokens=seq.num_prompt_tokens)
        self.session: EngineSession | None = None

    @property
    def done(self) -> bool:
        return self.seq.is_finished

    @property
    def text(self) -> str:
        return self.detok.text if self.detok else ""


class Stream:
    """Iterator over a request's events; `cancel()` is safe from another thread."""

    def __init__(self, engine: EngineLoop, request: Request):
        self.engine, self.request = engine, request

    def __iter__(self) -> Iterator[StreamEvent]:
        req = self.request
        while True:
            while req.events:
                event = req.events.popleft()
                yield event
                if event.kind == "done":
                    return
            self.engine.step()

    def cancel(self) -> None:
        self.request.cancelled.set()

    @property
    def token_ids(self) -> list[int]:
        return self.request.seq.completion_token_ids

    @property
    def text(self) -> str:
        return self.request.text
