"""Paged KV-cache block manager: a sequence's block table over the block pool
(engine.runtime.block_pool), with hash-chained prefix caching (engine.runtime.prefix_cache).
Torch-free.

A block holds the KV of `block_size` consecutive tokens. A full page is identified by a hash
of its tokens chained with the hash of the page before it, so equal hashes mean equal whole
prefixes. Freed blocks keep their hash and sit in an LRU: a later request with the same prefix
revives them, and only taking a free block for new tokens evicts (forgets) its hash.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from engine.runtime.block_pool import BlockPool
from engine.runtime.prefix_cache import PrefixCache, chain_hashes
from engine.runtime.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.prefix = PrefixCache(self.pool.blocks, block_size, enable_prefix_caching)
        self.pool.on_evict = self.prefix.forget

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_cached_blocks(self) -> int:
        return self.prefix.num_cached

    def match_prefix(self, token_ids: Seq[int]) -> list[int]:
        return self.prefix.match(token_ids)

    def _reusable_prefix(self, seq: Sequence) -> tuple[list[int], bool]:
        """The blocks that already hold seq's leading pages, and whether the rest fits."""
        # a session names its pages; other requests look theirs up by hash
        matched = list(seq.prefix_blocks) or self.prefix.match(seq.token_ids)
        # the model must compute at least one token to produce logits
        if matched and len(matched) * self.block_size >= len(seq):
            matched.pop()
        fresh = seq.num_blocks_for(len(seq), self.block_size) - len(matched)
        # free matched blocks get revived, so they cannot double as fresh ones
        revived = sum(1 for bid in matched if self.pool.blocks[bid].ref_count == 0)
        return matched, fresh <= self.num_free_blocks - revived

    def can_allocate(self, seq: Sequence) -> bool:
        return self._reusable_prefix(seq)[1]

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table, f"{seq} already has blocks"
        assert len(seq) > 0
        matched, fits = self._reusable_prefix(seq)
        if not fits:
            raise RuntimeError(f"not enough free KV blocks for {seq}; call can_allocate first")
        for bid in matched:  # revive before taking fresh blocks so they cannot be evicted
            self.pool.incref(bid)
        fresh = seq.num_blocks_for(len(seq), self.block_size) - len(matched)
        seq.block_table = matched + [self.pool.take_free() for _ in range(fresh)]
        seq.num_cached_tokens = len(matched) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        seq.num_hashed_blocks = len(matched)
        if not seq.prefix_blocks:
            seq.block_hashes = [self.pool.blocks[bid].hash for bid in matched]
        elif len(seq.prefix_hashes) >= len(matched):
            seq.block_hashes = list(seq.prefix_hashes[: len(matched)])
        else:  # a session's pages kept while caching was off: chain their hashes now
            seq.block_hashes = chain_hashes(seq.token_ids, len(matched), self.block_size)
        seq.last_block_hash = seq.block_hashes[-1] if seq.block_hashes else None

    def ensure_capacity(self, seq: Sequence, num_tokens: int) -> bool:
        need = seq.num_blocks_for(num_tokens, self.block_size) - len(seq.block_table)
        if need > self.num_free_blocks:
            return False
        seq.block_table.extend(self.pool.take_free() for _ in range(need))
        return True

    def trim(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Return the blocks past those num_tokens tokens need (taken for positions that
        were then rolled back); returns their ids."""
        keep = seq.num_blocks_for(num_tokens, self.block_size)
        extra = seq.block_table[keep:]
        assert keep >= seq.num_hashed_blocks, "a hashed block cannot be rolled back"
        del seq.block_table[keep:]
        self.pool.release(extra)
        return extra

    def commit_full_blocks(self, seq: Sequence) -> None:
        self.prefix.commit(seq)

    def free(self, seq: Sequence, keep: int = 0) -> None:
        """Return seq's blocks. The first `keep` blocks keep seq's reference instead: they
        move to seq.kept_blocks (with their chain hashes), pinned for a session."""
        if not seq.block_table:
            raise RuntimeError(f"{seq} has no blocks to free (double free?)")
        keep = min(keep, len(seq.block_table))
        seq.kept_blocks = seq.block_table[:keep]
        seq.kept_hashes = seq.block_hashes[:keep] if len(seq.block_hashes) >= keep else []
        # tail first: the LRU then evicts the tail of a prefix before its head
        self.pool.release(seq.block_table[keep:])
        seq.block_table = []
        seq.num_hashed_blocks = 0
        seq.last_block_hash = None
        seq.block_hashes = []

    def release(self, block_ids: list[int]) -> None:
        """Drop references taken by free(keep=...) or take(); tail first, as free()."""
        self.pool.release(block_ids)

    def take(self, num_blocks: int) -> list[int]:
        """Fresh blocks, each referenced once by the caller (a restored snapshot)."""
        return self.pool.take(num_blocks)

    def register(self, block_ids: list[int], token_ids: Seq[int]) -> list[bytes]:
        """Hash blocks that hold token_ids' full pages, in order, so other requests with the
        same prefix find them; returns the chain hashes."""
        return self.prefix.register(block_ids, token_ids)

    def reset_prefix_cache(self) -> int:
        """Forget the hashes of all free blocks; returns how many were dropped."""
        return self.prefix.forget_all(self.pool.free_lru)
