"""CLOCK eviction for the GPU tier (SparseConfig.eviction = "clock"): the slots form a ring
with a hand; a missing unit takes the next slot from the hand on that the step does not
read and that was not read since the hand last passed it. A slot the hand passes that was
read since (its read count `uses` > 0) loses that mark (uses = 0) and stays: a second
chance, so slots read again and again stay resident, as with least-recently-used, at
the cost of the few slots the hand passes instead of a select over every slot.

The step's resident slots are marked with the step (`marks` [S + 1] int32: a slot whose
mark equals the step's is read by it, and so never a victim). The ring holds slots 0..S-1
(S: the tier's slots; index S is the scratch slot). With too few unmarked, unread slots in
one turn of the ring, the second turn takes the slots whose read mark the first cleared,
so m victims always exist when the step reads at most S units (the callers' check).

`allocate_clock_triton`: the resolve kernel of kernels.tier_alloc (marking with the step),
then `_clock_kernel`, one program: the owners and their ranks, the ring walk from the
hand, the marks it clears, the hand, the assignment and the compact fetch list; then the
gather and the finish kernel of kernels.tier_alloc. Four launches a layer, against 14 with
the value eviction's select over every slot. `allocate_clock_reference`: the same in torch
(kernels.tier_alloc.allocate_reference with `clock_victims`); both leave the same tables,
marks, hand, slots and counters (tests/kernels/test_tier_clock.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels import HAS_TRITON
from kernels.tier_alloc import LayerState, _gather, allocate_reference
from kernels.views import Stage

RING_BLOCK = 1024  # slots per round of the ring walk
ENTRY_BLOCK = 1024  # entries per round of the owners and the assignment

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.tier_alloc import _finish_kernel, _resolve_kernel, _take_victims

    @triton.jit
    def _clock_kernel(
        U_IN, SLOT_IN, CLAIM, RANK, MARKS, USES, UNIT_IN, SLOT_OF, HAND, CLOCK, VICTIMS,
        SRC, DST, COUNT, ACC, n, S, C_FETCHED, C_EVICTED, C_DEMAND,
        BLOCK: tl.constexpr, SBLOCK: tl.constexpr,
    ):  # fmt: skip
        # 1. the owners (a missing unit's first listing: the claims are complete) and
        # their ranks (inclusive counts, in entry order)
        total = tl.zeros([], tl.int32)
        for start in range(0, n, BLOCK):
            i = start + tl.arange(0, BLOCK)
            m = i < n
            u = tl.load(U_IN + i, mask=m, other=0)
            missing = tl.load(SLOT_IN + i, mask=m, other=0) < 0
            owner = m & missing & (tl.load(CLAIM + u, mask=m, other=-1) == i)
            rank = total + tl.cumsum(owner.to(tl.int32), 0)
            tl.store(RANK + i, rank, mask=m)
            total += tl.sum(owner.to(tl.int32), 0)
        # 2. the ring from the hand: the first `total` candidates (first turn: unmarked,
        # unread since the hand passed; second turn: unmarked, read), nothing written yet
        step = tl.load(CLOCK).to(tl.int32)
        hand = tl.load(HAND)
        found = tl.zeros([], tl.int32)
        end = tl.zeros([], tl.int64)  # the walk's length: just past the last victim
        pos0 = tl.zeros([], tl.int64)
        while (found < total) & (pos0 < 2 * S):
            pos = pos0 + tl.arange(0, SBLOCK)
            inside = pos < 2 * S
            slot = (hand + pos) % S
            marked = tl.load(MARKS + slot, mask=inside, other=0) == step
            read = tl.load(USES + slot, mask=inside, other=0) > 0
            cand = inside & ~marked & (read == (pos >= S))
            vr = found + tl.cumsum(cand.to(tl.int32), 0)
            chosen = cand & (vr <= total)
            tl.store(VICTIMS + vr - 1, slot, mask=chosen)
            end = tl.maximum(end, tl.max(tl.where(chosen & (vr == total), pos + 1, 0), 0))
            found += tl.sum(cand.to(tl.int32), 0)
            pos0 += SBLOCK
        tl.debug_barrier()
        # 3. the first turn's passed slots lose their read mark; the hand moves on
        for start in range(0, tl.minimum(end, S), SBLOCK):
            pos = start + tl.arange(0, SBLOCK)
            passed = pos < tl.minimum(end, S)
            tl.store(USES + (hand + pos) % S, tl.zeros([SBLOCK], tl.int64), mask=passed)
        tl.store(HAND, (hand + end) % S)
        tl.debug_barrier()
        # 4. owner r takes victim r (kernels.tier_alloc._take_victims), marked read
        for start in range(0, n, BLOCK):
            i = start + tl.arange(0, BLOCK)
            m = i < n
            owner, evicted, dst = _take_victims(U_IN, RANK, VICTIMS, SLOT_OF, UNIT_IN, USES,
                                                SRC, DST, i, m, total, BLOCK)  # fmt: skip
            tl.store(MARKS + dst, step, mask=owner)
            tl.atomic_add(ACC + C_EVICTED, tl.sum(evicted.to(tl.int64), 0))
        tl.store(COUNT, total.to(tl.int64))
        tl.atomic_add(ACC + C_FETCHED, total.to(tl.int64))
        tl.atomic_add(ACC + C_DEMAND, total.to(tl.int64))


def allocate_clock_triton(st: LayerState, units: torch.Tensor, valid: torch.Tensor,
                          acc: torch.Tensor, counters: dict[str, int],
                          stage: Stage | None = None,
                          before_gather: Callable[[], None] | None = None) -> torch.Tensor:  # fmt: skip
    """kernels.tier_alloc.allocate_triton with the CLOCK eviction (st.marks, st.hand)."""
    n, dev = units.numel(), units.device
    S1 = st.unit_in.shape[0]
    assert n <= S1 - 1, f"{n} entries for {S1 - 1} slots"
    assert st.marks is not None and st.hand is not None, "the CLOCK eviction's state"
    u = torch.empty(n, dtype=torch.long, device=dev)
    slot_in = torch.empty(n, dtype=torch.long, device=dev)
    B = ENTRY_BLOCK
    _resolve_kernel[(triton.cdiv(n, B),)](
        units, valid, st.slot_of, st.claim, st.marks, st.last_used, st.clock, u, slot_in, acc,
        n, st.scratch_unit, counters["locality_hits"], counters["locality_total"], BLOCK=B,
        MARK_CLOCK=True,
    )  # fmt: skip
    rank = torch.empty(n, dtype=torch.int32, device=dev)
    victims = torch.empty(n, dtype=torch.long, device=dev)
    src = torch.empty(n, dtype=torch.int32, device=dev)
    dst = torch.empty(n, dtype=torch.int32, device=dev)
    count = torch.empty(1, dtype=torch.long, device=dev)
    _clock_kernel[(1,)](
        u, slot_in, st.claim, rank, st.marks, st.uses, st.unit_in, st.slot_of, st.hand,
        st.clock, victims, src, dst, count, acc, n, S1 - 1, counters["fetched"],
        counters["evicted"], counters["demand_fetched"], BLOCK=B, SBLOCK=RING_BLOCK,
        num_warps=8,
    )  # fmt: skip
    _gather(st, src, dst, acc, counters, stage, before_gather, count)
    out = torch.empty(n, dtype=torch.int32, device=dev)
    _finish_kernel[(triton.cdiv(n, B),)](u, st.slot_of, st.last_used, st.uses, st.clock,
                                         st.claim, out, n, st.scratch_slot, BLOCK=B)  # fmt: skip
    return out


def allocate_clock_reference(st, units, valid, acc, counters, stage=None, before_gather=None):
    """allocate_clock_triton in torch ops (the CPU engine's path)."""
    return allocate_reference(st, units, valid, acc, counters, stage, before_gather,
                              victims=clock_victims)  # fmt: skip


def clock_victims(st, slot: torch.Tensor, missing: torch.Tensor,
                  owner: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The owners' slots in rank order by the ring walk (the module's docstring), the marks
    it clears and the hand's new place; the step's resident slots and the victims are
    marked read. Fixed shapes, no host read."""
    S = st.unit_in.shape[0] - 1
    n, dev = owner.numel(), owner.device
    step = st.clock.to(torch.int32)
    st.marks.index_put_((torch.where(missing, st.scratch_slot, slot),), step.expand(n))
    m = owner.sum()
    pos = torch.arange(2 * S, device=dev)
    ring = (st.hand + pos) % S
    marked = st.marks[ring] == step
    read = st.uses[ring] > 0
    cand = ~marked & (read == (pos >= S))
    vr = torch.cumsum(cand, 0)
    chosen = cand & (vr <= m)
    order = torch.sort(torch.where(chosen, pos, 2 * S)).values[:n]
    victims = torch.cat([ring, ring.new_full((1,), st.scratch_slot)])[order]
    end = torch.where(chosen & (vr == m), pos + 1, 0).max()
    first = ring[:S]
    st.uses[first] = torch.where(pos[:S] < end, 0, st.uses[first])
    st.hand.copy_((st.hand + end) % S)
    st.marks.index_put_((victims,), step.expand(n))
    return victims
