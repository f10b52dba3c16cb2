"""The prefix cache: full pages found again by a hash of their tokens chained with the hash
of the page before them, so equal hashes mean equal whole prefixes. Torch-free.

A page stays registered after its last reference goes (it sits in the block pool's LRU): a
later request with the same prefix revives it, and only taking the page for new tokens
forgets its hash.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable
from collections.abc import Sequence as Seq

from engine.runtime.block_pool import Block
from engine.runtime.sequence import Sequence


def compute_block_hash(token_ids: Seq[int], parent_hash: bytes | None) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(parent_hash or b"")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def chain_hashes(token_ids: Seq[int], num_pages: int, page_size: int) -> list[bytes]:
    """The chain hashes of the first num_pages full pages of token_ids."""
    parent, out = None, []
    for i in range(num_pages):
        parent = compute_block_hash(token_ids[i * page_size : (i + 1) * page_size], parent)
        out.append(parent)
    return out


class PrefixCache:
    def __init__(self, blocks: list[Block], block_size: int, enabled: bool = True) -> None:
        self.blocks, self.block_size, self.enabled = blocks, block_size, enabled
        self.hash_to_block: dict[bytes, int] = {}

    @property
    def num_cached(self) -> int:
        return len(self.hash_to_block)

    def match(self, token_ids: Seq[int]) -> list[int]:
        """The registered blocks holding token_ids' leading full pages, in order."""
        if not self.enabled:
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

    def commit(self, seq: Sequence) -> None:
        """Register the sequence's computed full pages that are not yet hashed."""
        if not self.enabled:
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

    def register(self, block_ids: list[int], token_ids: Seq[int]) -> list[bytes]:
        """Hash blocks that hold token_ids' full pages, in order, so other requests with the
        same prefix find them; returns the chain hashes."""
        bs = self.block_size
        hashes = chain_hashes(token_ids, len(block_ids), bs)
        for i, (bid, h) in enumerate(zip(block_ids, hashes, strict=True)):
            block = self.blocks[bid]
            if self.enabled and h not in self.hash_to_block:
                assert block.hash is None, f"block {bid} is already hashed"
                block.hash, block.token_ids = h, tuple(token_ids[i * bs : (i + 1) * bs])
                self.hash_to_block[h] = bid
        return hashes

    def forget(self, block: Block) -> bool:
        """Unregister a block (it is taken for new tokens); False if it held no hash."""
        if block.hash is None:
            return False
        del self.hash_to_block[block.hash]
        block.hash, block.token_ids = None, ()
        return True

    def forget_all(self, block_ids: Iterable[int]) -> int:
        """Unregister these blocks; returns how many held a hash."""
        return sum(self.forget(self.blocks[bid]) for bid in block_ids)
