"""The GPU tier's CLOCK eviction (kernels.tier_clock): the kernels against the torch reference
over the same random steps (bit for bit: page table, slot owners, read marks, hand, slot
contents, counters), and the policy itself: free slots first in ring order, a slot read
since the hand passed gets a second chance, and a full turn of read slots still yields its
victims."""

from __future__ import annotations

import pytest
import torch

from engine.kv.sparse_config import C as _C
from kernels.tier_alloc import NO_CLAIM, LayerState
from kernels.tier_clock import allocate_clock_reference, allocate_clock_triton
from tests.kernels.test_tier_alloc import clone, random_steps
from tests.kernels.test_tier_alloc import state as value_state
from tests.triton_marks import DEVICE, needs_triton


def state(S: int, U: int) -> tuple[LayerState, torch.Tensor]:
    """test_tier_alloc's layer state, with the CLOCK eviction's marks and hand."""
    st, rest = value_state(S, U)
    st.marks = torch.full((S + 1,), -1, dtype=torch.int32, device=DEVICE)
    st.hand = torch.zeros((), dtype=torch.long, device=DEVICE)
    return st, rest["acc"]


@needs_triton
@pytest.mark.parametrize("n,S,U", [(20, 30, 120), (1500, 1600, 5000), (40, 41, 400)])
def test_kernels_match_the_reference(n, S, U):
    """One block of entries and a ring shorter than a round of the walk; several blocks
    and rounds; a tier with one slot more than the step reads (second turns)."""
    a, acc_a = state(S, U)
    b, rest = clone(a, {"acc": acc_a})
    acc_b = rest["acc"]
    for step, (units, valid, stage) in enumerate(random_steps(n, U, a, seed=n)):
        for s in (a, b):
            s.clock += 1
        got = allocate_clock_triton(a, units, valid, acc_a, _C, stage=stage)
        want = allocate_clock_reference(b, units, valid, acc_b, _C, stage=stage)
        assert torch.equal(got.cpu(), want.cpu()), step
        for f in ("slot_of", "unit_in", "last_used", "uses", "slots", "marks"):
            end = a.scratch_unit if f == "slot_of" else a.scratch_slot  # scratch aside
            x, y = getattr(a, f)[:end].cpu(), getattr(b, f)[:end].cpu()
            assert torch.equal(x, y), (step, f)
        assert int(a.hand) == int(b.hand), step
        assert torch.equal(acc_a.cpu(), acc_b.cpu()), step
        for s in (a, b):  # claims end with the call (the next one starts clean)
            assert (s.claim == NO_CLAIM).all()
        # every valid unit is resident in the slot returned, with the host's rows or the stage's
        live = valid.cpu()
        assert torch.equal(a.unit_in[got.long()].cpu()[live], units.cpu()[live])
    acc = acc_a.cpu()
    assert acc[_C["evicted"]] > 0 and acc[_C["prefetch_hits"]] > 0 and acc[_C["locality_hits"]] > 0


def step(st, acc, units: list[int], impl=allocate_clock_reference) -> list[int]:
    st.clock += 1
    t = torch.tensor(units, dtype=torch.long, device=st.slot_of.device)
    return impl(st, t, torch.ones_like(t, dtype=torch.bool), acc, _C).tolist()


IMPLS = [allocate_clock_reference, pytest.param(allocate_clock_triton, marks=needs_triton)]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_hand_gives_read_slots_a_second_chance(impl):
    st, acc = state(4, 20)
    assert step(st, acc, [10, 11], impl) == [0, 1]  # free slots in ring order
    assert step(st, acc, [12, 13], impl) == [2, 3]
    assert int(st.hand) == 0
    # every slot was read since the hand passed: the first turn clears their marks, the
    # second takes the slots from the hand on (units 10 and 11 leave)
    assert step(st, acc, [14, 15], impl) == [0, 1]
    assert st.uses.tolist()[:4] == [1, 1, 0, 0]  # 12 and 13 lost their read mark
    assert int(st.hand) == 2
    # unit 12 is read again (a second chance); 13 was not: it goes
    assert step(st, acc, [12, 16], impl) == [2, 3]
    assert st.unit_in.tolist()[:4] == [14, 15, 12, 16]
    assert int(st.hand) == 0
    # every slot read again since the hand passed, 12 (slot 2) at this step: the first
    # turn clears the marks of slots 0, 1 and 3, the second takes 0 and 1
    assert step(st, acc, [12, 17, 18], impl) == [2, 0, 1]
    assert int(acc[_C["evicted"]]) == 5
