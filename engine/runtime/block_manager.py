"""Paged KV-cache block manager with hash-chained prefix caching. Torch-free.

A block holds the KV of `block_size` consecutive tokens. A full page is identified by a hash
of its tokens chained with the hash of the page before it, so equal hashes mean equal whole
prefixes. Freed blocks keep their hash and sit in an LRU: a later request with the same prefix
revives them, and only taking a free block for new tokens evicts (forgets) its hash.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from engine.runtime.sequence import Sequence


def compute_block_hash(token_ids: Seq[int], parent_hash: bytes | None) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(parent_hash or b"")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def _chain(token_ids: Seq[int], num_pages: int, page_size: int) -> list[bytes]:
    """The chain hashes of the first num_pages full pages of token_ids."""
    parent, out = None, []
    for i in range(num_pages):
        parent = compute_block_hash(token_ids[i * page_size : (i + 1) * page_size], parent)
        out.append(parent)
    return out


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set only while registered in the hash table
    token_ids: tuple[int, ...] = ()  # the full page, kept to verify hash hits


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block: dict[bytes, int] = {}
        # ref_count == 0 blocks, least recently freed first (the next to be evicted)
        self.free_lru: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_lru)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block)

    def _blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def match_prefix(self, token_ids: Seq[int]) -> list[int]:
        if not self.enable_prefix_caching:
            return []
        bs, parent, matched = self.block_size, None, []
        for start in range(0, len(token_ids) - bs + 1, bs):
            page = tuple(token_ids[start : start + bs])
            parent = compute_block_hash(page, parent)
            bid = self.hash_to_block.get(parent)
            if bid is None or self.blocks[bid].token_ids != page:
                break
            matched.append(bid)
        return matched

    def _reusable_prefix(self, seq: Sequence) -> list[int]:
        # a session names its pages; other requests look theirs up by hash
        matched = list(seq.prefix_blocks) or self.match_prefix(seq.token_ids)
        # the model must compute at least one token to produce logits
        if matched and len(matched) * self.block_size >= len(seq):
            matched.pop()
        return matched

    def _fits(self, seq: Sequence, matched: list[int]) -> bool:
        fresh = self._blocks_for(len(seq)) - len(matched)
        # free matched blocks get revived, so they cannot double as fresh ones
        revived = sum(1 for bid in matched if self.blocks[bid].ref_count == 0)
        return fresh <= self.num_free_blocks - revived

    def can_allocate(self, seq: Sequence) -> bool:
        return self._fits(seq, self._reusable_prefix(seq))

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table, f"{seq} already has blocks"
        assert len(seq) > 0
        matched = self._reusable_prefix(seq)
        if not self._fits(seq, matched):
            raise RuntimeError(f"not enough free KV blocks for {seq}; call can_allocate first")
        for bid in matched:  # revive before taking fresh blocks so they cannot be evicted
            self._incref(bid)
        fresh = self._blocks_for(len(seq)) - len(matched)
        seq.block_table = matched + [self._take_free() for _ in range(fresh)]
        seq.num_cached_tokens = len(matched) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        seq.num_hashed_blocks = len(matched)
        if not seq.prefix_blocks:
            seq.block_hashes = [self.blocks[bid].hash for bid in matched]
        elif len(seq.prefix_hashes) >= len(matched):
            seq.block_hashes = list(seq.prefix_hashes[: len(matched)])
        else:  # a session's pages kept while caching was off: chain their hashes now
            seq.block_hashes = _chain(seq.token_ids, len(matched), self.block_size)
        seq.last_block_hash = seq.block_hashes[-1] if seq.block_hashes else None

    def ensure_capacity(self, seq: Sequence, num_tokens: int) -> bool:
        need = self._blocks_for(num_tokens) - len(seq.block_table)
        if need > self.num_free_blocks:
            return False
        seq.block_table.extend(self._take_free() for _ in range(need))
        return True

    def trim(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Return the blocks past those num_tokens tokens need (taken for positions that
        were then rolled back); returns their ids."""
        keep = self._blocks_for(num_tokens)
        extra = seq.block_table[keep:]
        assert keep >= seq.num_hashed_blocks, "a hashed block cannot be rolled back"
        del seq.block_table[keep:]
        for bid in reversed(extra):
            self._decref(bid)
        return extra

    def commit_full_blocks(self, seq: Sequence) -> None:
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = seq.num_computed_tokens // bs
        assert num_full <= len(seq.block_table), f"{seq} computed past its blocks"
        for i in range(seq.num_hashed_blocks, num_full):
            page = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = compute_block_hash(page, seq.last_block_hash)
            # an identical page registered under another id keeps its mapping: the seq's
            # copy stays unhashed and is recycled like any uncached block
            if h not in self.hash_to_block:
                block = self.blocks[seq.block_table[i]]
                assert block.hash is None, f"block {block.block_id} is already hashed"
                block.hash, block.token_ids = h, page
                self.hash_to_block[h] = block.block_id
            seq.last_block_hash = h
            seq.block_hashes.append(h)
            seq.num_hashed_blocks = i + 1

    def free(self, seq: Sequence, keep: int = 0) -> None:
        """Return seq's blocks. The first `keep` blocks keep seq's reference instead: they
        move to seq.kept_blocks (with their chain hashes), pinned for a session."""
        if not seq.block_table:
            raise RuntimeError(f"{seq} has no blocks to free (double free?)")
        keep = min(keep, len(seq.block_table))
        seq.kept_blocks = seq.block_table[:keep]
        seq.kept_hashes = seq.block_hashes[:keep] if len(seq.block_hashes) >= keep else []
        # tail first: the LRU then evicts the tail of a prefix before its head, because
        # losing a head page makes every page chained after it unreachable
        for bid in reversed(seq.block_table[keep:]):
            self._decref(bid)
        seq.block_table = []
        seq.num_hashed_blocks = 0
        seq.last_block_hash = None
        seq.block_hashes = []

    def release(self, block_ids: list[int]) -> None:
        """Drop references taken by free(keep=...) or take(); tail first, as free()."""
        for bid in reversed(block_ids):
            self._decref(bid)

    def take(self, num_blocks: int) -> list[int]:
        """Fresh blocks, each referenced once by the caller (a restored snapshot)."""
        if num_blocks > self.num_free_blocks:
            raise RuntimeError(f"{num_blocks} blocks wanted, {self.num_free_blocks} free")
        return [self._take_free() for _ in range(num_blocks)]

    def register(self, block_ids: list[int], token_ids: Seq[int]) -> list[bytes]:
        """Hash blocks that hold token_ids' full pages, in order, so other requests with the
        same prefix find them; returns the chain hashes."""
        bs = self.block_size
        hashes = _chain(token_ids, len(block_ids), bs)
        for i, (bid, h) in enumerate(zip(block_ids, hashes, strict=True)):
            block = self.blocks[bid]
            if self.enable_prefix_caching and h not in self.hash_to_block:
                assert block.hash is None, f"block {bid} is already hashed"
                block.hash, block.token_ids = h, tuple(token_ids[i * bs : (i + 1) * bs])
                self.hash_to_block[h] = bid
        return hashes

    def slot(self, seq: Sequence, position: int) -> int:
        bs = self.block_size
        return seq.block_table[position // bs] * bs + position % bs

    def reset_prefix_cache(self) -> int:
        """Forget the hashes of all free blocks; returns how many were dropped."""
        dropped = 0
        for bid in self.free_lru:
            dropped += self._unhash(self.blocks[bid])
        return dropped

    def _take_free(self) -> int:
        bid, _ = self.free_lru.popitem(last=False)
        block = self.blocks[bid]
        assert block.ref_count == 0
        self._unhash(block)  # eviction
        block.ref_count = 1
        return bid

    def _unhash(self, block: Block) -> bool:
        if block.hash is None:
            return False
        del self.hash_to_block[block.hash]
        block.hash, block.token_ids = None, ()
        return True

    def _incref(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self.free_lru[bid]
        block.ref_count += 1

    def _decref(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count <= 0:
            raise RuntimeError(f"block {bid} freed more times than it was allocated")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_lru[bid] = None
