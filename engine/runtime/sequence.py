"""A request's token state as the scheduler and block manager see it. Torch-free."""

from __future__ import annotations

import enum
import itertools

from engine.sampling_params import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    _ids = itertools.count()

    def __init__(self, token_ids: list[int], params: SamplingParams | None = None):
        self.seq_id = next(Sequence._ids)
        self.status = SeqStatus.WAITING
        self.token_ids: list[int] = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.params = params or SamplingParams()
        # tokens whose KV is written in the cache (prefix-cache hits included)
        self.num_computed_tokens = 0
        # tokens of the prompt taken from the prefix cache instead of being prefilled
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        # prefix-cache progress: leading blocks of block_table already hashed, and the last
        # hash, so each step only hashes the pages it completed (reset when blocks are freed)
        self.num_hashed_blocks = 0
        self.last_block_hash: bytes | None = None
        self.block_hashes: list[bytes] = []  # chain hash of each committed block, in order
        self.finish_reason: str | None = None
        # a session's follow-up: the pages (and their chain hashes) that already hold the
        # first len(prefix_blocks) * page_size tokens; allocate() takes them without lookups
        self.prefix_blocks: list[int] = []
        self.prefix_hashes: list[bytes] = []
        # keep_pages: when it finishes, the sequence's computed full pages stay referenced
        # (kept_blocks, kept_hashes) for its session instead of returning to the free list
        self.keep_pages = False
        self.kept_blocks: list[int] | None = None
        self.kept_hashes: list[bytes] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def num_blocks_for(self, num_tokens: int, block_size: int) -> int:
        return (num_tokens + block_size - 1) // block_size

    def slot(self, position: int, block_size: int) -> int:
        """Where the KV of `position` lives: its page's id * block_size + its offset."""
        return self.block_table[position // block_size] * block_size + position % block_size

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, status={self.status.value}, len={len(self)}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
