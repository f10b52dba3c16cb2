from __future__ import annotations

import pytest

from engine.runtime.block_manager import BlockManager
from engine.runtime.prefix_cache import compute_block_hash
from engine.runtime.sequence import Sequence

BS = 4


def admit(bm: BlockManager, tokens: list[int]) -> Sequence:
    """Allocate a sequence and pretend the model computed all of its tokens."""
    seq = Sequence(tokens)
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    seq.num_computed_tokens = len(seq)
    bm.commit_full_blocks(seq)
    return seq


def refs(bm: BlockManager, seq: Sequence) -> list[int]:
    return [bm.pool.blocks[b].ref_count for b in seq.block_table]


def test_compute_block_hash_chains_on_parent():
    h1 = compute_block_hash([1, 2, 3, 4], None)
    assert h1 == compute_block_hash((1, 2, 3, 4), b"") and len(h1) == 16
    assert compute_block_hash([5, 6, 7, 8], h1) != compute_block_hash([5, 6, 7, 8], None)


def test_same_prefix_shares_blocks():
    bm = BlockManager(16, BS)
    a = admit(bm, list(range(10)))  # 2 full pages + 2 tokens
    assert bm.num_cached_blocks == 2 and bm.num_free_blocks == 13
    b = Sequence(list(range(8)) + [99, 98, 97])
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == b.num_computed_tokens == 8
    assert refs(bm, a) == [2, 2, 1] and refs(bm, b) == [2, 2, 1]
    assert bm.num_free_blocks == 12


def test_different_token_in_page_two_shares_only_page_one():
    bm = BlockManager(16, BS)
    a = admit(bm, list(range(12)))
    tokens = list(range(12))
    tokens[5] = 100
    assert bm.match_prefix(tokens) == a.block_table[:1]
    b = Sequence(tokens)
    bm.allocate(b)
    assert b.block_table[0] == a.block_table[0]
    assert set(b.block_table[1:]).isdisjoint(a.block_table)
    assert b.num_cached_tokens == 4


def test_match_prefix_verifies_tokens_not_only_hash():
    bm = BlockManager(8, BS)
    a = admit(bm, [1, 2, 3, 4, 5])
    bm.pool.blocks[a.block_table[0]].token_ids = (9, 9, 9, 9)  # simulate a hash collision
    assert bm.match_prefix([1, 2, 3, 4, 5]) == []


def test_match_prefix_has_no_side_effects():
    bm = BlockManager(8, BS)
    a = admit(bm, list(range(9)))
    bm.free(a)
    free_before, order_before = bm.num_free_blocks, list(bm.pool.free_lru)
    assert len(bm.match_prefix(list(range(9)))) == 2
    assert bm.num_free_blocks == free_before and list(bm.pool.free_lru) == order_before


def test_ref_counts_and_free_return_blocks():
    bm = BlockManager(8, BS)
    a = admit(bm, list(range(9)))
    b = admit(bm, list(range(9)))  # shares 2 pages, fresh third block
    assert refs(bm, b) == [2, 2, 1]
    assert bm.num_free_blocks == 8 - 4
    bm.free(a)
    assert refs(bm, b) == [1, 1, 1]
    assert a.block_table == [] and a.num_hashed_blocks == 0 and a.last_block_hash is None
    assert bm.num_free_blocks == 5
    bm.free(b)
    assert bm.num_free_blocks == 8
    assert all(blk.ref_count == 0 for blk in bm.pool.blocks)


def test_double_free_raises():
    bm = BlockManager(8, BS)
    a = admit(bm, [1, 2, 3])
    bm.free(a)
    with pytest.raises(RuntimeError):
        bm.free(a)
    a.block_table = [0]  # a stale copy of a freed table must not drive ref counts negative
    with pytest.raises(RuntimeError):
        bm.free(a)
    assert all(blk.ref_count == 0 for blk in bm.pool.blocks)


def test_revival_of_freed_cached_prefix():
    bm = BlockManager(8, BS)
    a = admit(bm, list(range(10)))
    head = a.block_table[:2]
    bm.free(a)
    assert bm.num_free_blocks == 8 and bm.num_cached_blocks == 2
    b = Sequence(list(range(8)) + [50])
    assert bm.can_allocate(b)
    bm.allocate(b)
    assert b.block_table[:2] == head
    assert refs(bm, b) == [1, 1, 1]
    assert not set(head) & set(bm.pool.free_lru)
    assert bm.num_free_blocks == 5
    assert b.num_hashed_blocks == 2 and b.last_block_hash == bm.pool.blocks[head[1]].hash


def test_lru_evicts_least_recently_freed_first_and_tails_before_heads():
    bm = BlockManager(6, BS)
    a = admit(bm, list(range(12)))  # 3 full pages
    b = admit(bm, list(range(100, 112)))  # 3 full pages, fills the cache
    assert bm.num_free_blocks == 0
    bm.free(a)
    bm.free(b)
    a_blocks = bm.match_prefix(list(range(12)))
    b_blocks = bm.match_prefix(list(range(100, 112)))
    # a was freed first, and within a sequence the tail is freed first
    assert list(bm.pool.free_lru) == a_blocks[::-1] + b_blocks[::-1]
    # one fresh block evicts a's tail page only: a's first two pages still match
    c = Sequence([7, 7, 7])
    bm.allocate(c)
    assert c.block_table == [a_blocks[2]]
    assert bm.match_prefix(list(range(12))) == a_blocks[:2]
    assert bm.match_prefix(list(range(100, 112))) == b_blocks
    assert bm.num_cached_blocks == 5


def test_fully_cached_prompt_recomputes_last_page():
    bm = BlockManager(8, BS)
    a = admit(bm, list(range(8)))
    b = Sequence(list(range(8)))
    assert bm.match_prefix(b.token_ids) == a.block_table
    bm.allocate(b)
    assert b.block_table[0] == a.block_table[0]
    assert b.block_table[1] != a.block_table[1]
    assert b.num_cached_tokens == b.num_computed_tokens == 4
    assert b.num_uncomputed_tokens == 4
    # the recomputed page is identical: the existing mapping stays, b's copy is not hashed
    b.num_computed_tokens = 8
    bm.commit_full_blocks(b)
    assert bm.prefix.hash_to_block[b.last_block_hash] == a.block_table[1]
    assert bm.pool.blocks[b.block_table[1]].hash is None
    assert b.num_hashed_blocks == 2
    assert bm.num_cached_blocks == 2


def test_can_allocate_counts_revived_blocks():
    bm = BlockManager(3, BS)
    a = admit(bm, list(range(8)))  # 2 cached pages
    bm.free(a)
    # 3 free blocks; 2 of them are revived prefix pages, so only 1 fresh block is left
    assert bm.can_allocate(Sequence(list(range(8)) + [1, 2, 3, 4]))  # 2 revived + 1 fresh
    assert not bm.can_allocate(Sequence(list(range(8)) + [1] * 5))  # 2 revived + 2 fresh
    assert bm.can_allocate(Sequence([9] * 12))  # no match: evicts all 3
    with pytest.raises(RuntimeError):
        bm.allocate(Sequence(list(range(8)) + [1] * 5))
    assert bm.num_free_blocks == 3 and bm.num_cached_blocks == 2


def test_commit_hashes_pages_as_they_fill():
    bm = BlockManager(8, BS)
    s = Sequence(list(range(6)))
    bm.allocate(s)
    s.num_computed_tokens = 3
    bm.commit_full_blocks(s)
    assert s.num_hashed_blocks == 0 and bm.num_cached_blocks == 0
    s.num_computed_tokens = 6
    bm.commit_full_blocks(s)
    assert s.num_hashed_blocks == 1
    for t in (6, 7):  # two decode steps fill page 2 with generated tokens
        s.append_token(t)
        assert bm.ensure_capacity(s, len(s))
        s.num_computed_tokens = len(s)
        bm.commit_full_blocks(s)
    assert s.num_hashed_blocks == 2
    assert s.last_block_hash == compute_block_hash(
        [4, 5, 6, 7], compute_block_hash([0, 1, 2, 3], None)
    )
    assert bm.match_prefix(list(range(8))) == s.block_table[:2]


def test_ensure_capacity_grows_and_failure_changes_nothing():
    bm = BlockManager(4, BS)
    s = admit(bm, [1, 2, 3])
    assert bm.ensure_capacity(s, 4) and len(s.block_table) == 1
    assert bm.ensure_capacity(s, 5) and len(s.block_table) == 2
    table, free = list(s.block_table), bm.num_free_blocks
    assert not bm.ensure_capacity(s, 17)  # needs 3 more blocks, 2 free
    assert s.block_table == table and bm.num_free_blocks == free
    assert bm.ensure_capacity(s, 16) and bm.num_free_blocks == 0


def test_slot():
    bm = BlockManager(8, BS)
    s = Sequence(list(range(6)))
    s.block_table = [5, 2]
    assert [s.slot(p, bm.block_size) for p in range(6)] == [20, 21, 22, 23, 8, 9]


def test_reset_prefix_cache_drops_only_free_blocks():
    bm = BlockManager(8, BS)
    a = admit(bm, list(range(8)))
    b = admit(bm, list(range(100, 108)))
    bm.free(a)
    assert bm.reset_prefix_cache() == 2
    assert bm.num_cached_blocks == 2
    assert bm.match_prefix(list(range(8))) == []
    assert bm.match_prefix(list(range(100, 108))) == b.block_table


def test_prefix_caching_disabled():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a = admit(bm, list(range(8)))
    assert bm.num_cached_blocks == 0 and a.num_hashed_blocks == 0
    assert bm.match_prefix(list(range(8))) == []
    b = admit(bm, list(range(8)))
    assert set(a.block_table).isdisjoint(b.block_table)
    assert b.num_cached_tokens == 0
