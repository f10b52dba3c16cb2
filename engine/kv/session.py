"""Live sessions: a conversation whose KV stays in the cache between turns.

A session remembers the tokens of its last turn (prompt and answer) and holds a reference
on the full pages that contain them, so LRU eviction cannot take them while the session is
open. The next turn's prompt is compared with those tokens: the pages of the longest common
prefix are handed to the request directly (no hash lookups) and only the rest is prefilled.
If the chat template renders the earlier turns differently from the tokens the model saw
(re-tokenised answers, stripped reasoning), the common prefix ends there; `last_reuse` says
where, and how many tokens were reused.

The pages can be saved to a KV snapshot file and restored in another process
(engine.kv.snapshot), so a resumed session prefills only its new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import EngineError
from engine.kv.snapshot import SnapshotError, load_snapshot, save_snapshot
from engine.runtime.requests import Stream
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.runtime.llm_engine import Engine


@dataclass(frozen=True, slots=True)
class ReuseInfo:
    previous_tokens: int  # tokens the session held before this turn
    common_tokens: int  # the longest common prefix of this turn's prompt with them
    reused_tokens: int  # prompt tokens whose KV was reused (whole pages)
    prompt_tokens: int

    @property
    def diverged(self) -> bool:
        """The prompt does not extend the previous turn's tokens: the template re-rendered
        an earlier turn differently from what the model generated."""
        return self.common_tokens < self.previous_tokens

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.reused_tokens


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class EngineSession:
    def __init__(self, engine: Engine, session_id: str) -> None:
        self.engine, self.id = engine, session_id
        self.messages: list[dict] = []  # the conversation, rendered again by append()
        self.token_ids: list[int] = []  # the last turn's prompt and answer
        self.blocks: list[int] = []  # pinned pages holding token_ids' first full pages
        self.hashes: list[bytes] = []  # their chain hashes (empty with caching off)
        self.last_reuse: ReuseInfo | None = None
        self.snapshot_error: str | None = None  # why a snapshot was refused
        self.restored_tokens = 0  # tokens whose KV came from a snapshot
        self._active: Stream | None = None
        self._dense_kv = None  # engine.kv.dense_kv.DenseKV of the last turn (CPU), if any
        self.closed = False

    @property
    def num_cached_tokens(self) -> int:
        """Tokens whose KV the session holds in the cache."""
        return len(self.blocks) * self.engine.config.page_size

    @property
    def busy(self) -> bool:
        return self._active is not None and not self._active.request.done

    def append(
        self,
        messages: list[dict],
        params: SamplingParams | None = None,
        tools: list[dict] | None = None,
    ) -> Stream:
        """Add messages to the conversation and stream the model's answer to all of it."""
        ids = self.engine.chat_tokens(self.messages + list(messages), tools=tools)
        stream = self.stream(ids, params)
        self.messages.extend(messages)
        return stream

    def stream(self, ids: list[int], params: SamplingParams | None = None) -> Stream:
        """Stream an answer to a whole prompt, reusing the pages of its common prefix with
        the session's last turn. The answer is not added to `messages`: the caller adds it
        (as the template renders it) with the next turn."""
        self._check_open()
        if self.busy:
            raise EngineError(f"session {self.id} is still answering")
        ids = list(ids)
        bs = self.engine.config.page_size
        common = common_prefix(ids, self.token_ids)
        # whole pages only, and the last prompt token is always computed (for its logits)
        n = min(common, len(ids) - 1, self.num_cached_tokens) // bs
        prefix = (self.blocks[:n], self.hashes[:n] if len(self.hashes) >= n else [])
        # (taken before the request exists: its end hands the session the next copy)
        dense, self._dense_kv = self._dense_kv, None
        try:
            req = self.engine.add_request(ids, params, session=self, prefix=prefix,
                                          dense_kv=dense if n else None)  # fmt: skip
        except BaseException:
            self._dense_kv = dense
            raise
        self.last_reuse = ReuseInfo(len(self.token_ids), common, n * bs, len(ids))
        self._active = Stream(self.engine, req)
        return self._active

    def _finished(self, seq, dense_kv=None) -> None:
        """Called by the engine, under its lock, when this session's request ends: its
        computed pages replace the session's previous pins. `dense_kv`: the CPU runner's
        contiguous copy of the sequence's KV, handed to the next turn so it need not be
        rebuilt from the pages."""
        if seq.kept_blocks is None:  # never scheduled (cancelled while waiting)
            return
        if self.closed:  # closed while answering: nothing to keep
            self.engine.block_manager.release(seq.kept_blocks)
            seq.kept_blocks = None
            return
        old = self.blocks
        self._dense_kv = dense_kv
        self.blocks, self.hashes = seq.kept_blocks, seq.kept_hashes
        self.token_ids = list(seq.token_ids)
        seq.kept_blocks = None
        self.engine.block_manager.release(old)

    def save(self, path) -> dict:
        """Write the session's pages and tokens to a KV snapshot file (atomically)."""
        self._check_open()
        if self.busy:
            raise EngineError(f"session {self.id} is still answering")
        n = len(self.blocks) * self.engine.config.page_size
        return save_snapshot(self.engine, path, self.blocks, self.token_ids[:n])

    def restore(self, path) -> bool:
        """Take pages and tokens from a snapshot file. A file that does not match this
        engine, or fails its checksums, is refused: `snapshot_error` says why, nothing is
        used, and the next turn prefills. Returns whether the KV was restored."""
        self._check_open()
        if self.token_ids:
            raise EngineError(f"session {self.id} already holds KV")
        try:
            blocks, hashes, tokens = load_snapshot(self.engine, path)
        except SnapshotError as e:
            self.snapshot_error = str(e)
            return False
        tiers = self.engine.runner.tiers
        if tiers is not None:
            with self.engine._lock:
                _enter_tiers(tiers, blocks, len(tokens))
        self.blocks, self.hashes, self.token_ids = blocks, hashes, tokens
        self.restored_tokens = len(tokens)
        self.snapshot_error = None
        return True

    def close(self) -> None:
        """Unpin the session's pages: they stay cached (LRU) for anyone with the prefix."""
        if self.closed:
            return
        if self.busy:
            self._active.cancel()
        blocks, self.blocks, self.hashes, self._dense_kv = self.blocks, [], [], None
        self.engine.close_session(self.id, blocks)
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise EngineError(f"session {self.id} is closed")


def _enter_tiers(tiers, blocks: list[int], num_tokens: int, chunk_pages: int = 256) -> None:
    """Pages a snapshot wrote into the host tier enter the tiers as a prefill's rows do: any
    GPU slot that still holds an earlier use of their page ids is freed, and their rows are
    folded into the key summaries that page selection scores (in chunks of pages)."""
    P = tiers.P
    tiers.drop_pages(list(blocks))
    for first in range(0, num_tokens, chunk_pages * P):
        positions = range(first, min(num_tokens, first + chunk_pages * P))
        tiers.fold_rows([blocks[i // P] for i in positions], [i % P for i in positions])
