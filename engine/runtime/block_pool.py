"""The KV pages as blocks: reference counts and the LRU of free blocks. Torch-free."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set only while registered in the prefix cache
    token_ids: tuple[int, ...] = ()  # the full page, kept to verify hash hits


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        # ref_count == 0 blocks, least recently freed first (the next to be evicted)
        self.free_lru: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # called with a free block when it is taken for new tokens (the prefix cache then
        # forgets its hash: eviction)
        self.on_evict: Callable[[Block], object] | None = None

    @property
    def num_free(self) -> int:
        return len(self.free_lru)

    def take_free(self) -> int:
        bid, _ = self.free_lru.popitem(last=False)
        block = self.blocks[bid]
        assert block.ref_count == 0
        if self.on_evict is not None:
            self.on_evict(block)
        block.ref_count = 1
        return bid

    def take(self, num_blocks: int) -> list[int]:
        """Fresh blocks, each referenced once by the caller."""
        if num_blocks > self.num_free:
            raise RuntimeError(f"{num_blocks} blocks wanted, {self.num_free} free")
        return [self.take_free() for _ in range(num_blocks)]

    def incref(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self.free_lru[bid]
        block.ref_count += 1

    def decref(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count <= 0:
            raise RuntimeError(f"block {bid} freed more times than it was allocated")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_lru[bid] = None

    def release(self, block_ids: list[int]) -> None:
        """Drop one reference of each block, tail first: the LRU then evicts the tail of a
        prefix before its head, because losing a head page makes every page chained after
        it unreachable."""
        for bid in reversed(block_ids):
            self.decref(bid)
