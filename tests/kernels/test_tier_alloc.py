"""The GPU tier's slot allocator as kernels (kernels.tier_alloc) against its torch
reference: after the same random steps (shared pages, invalid entries, a tier much smaller
than the pages, some units already staged on the device by a prefetch) both leave the same
page table, slot owners, recency, read counts, slot contents and counters."""

from __future__ import annotations

import pytest
import torch

from engine.kv.residency import SlotAllocator
from engine.kv.sparse_config import C as _C
from kernels import HAS_TRITON
from kernels.tier_alloc import NO_CLAIM, LayerState, allocate_reference, allocate_triton
from kernels.uva_gather import NOT_STAGED
from kernels.views import Stage
from tests.triton_marks import DEVICE, needs_triton


def state(S: int, U: int, P: int = 4, D: int = 8, seed: int = 0) -> tuple[LayerState, dict]:
    g = torch.Generator().manual_seed(seed)
    host = torch.randn(U + 1, 2, P, D, generator=g)
    host = host.pin_memory() if DEVICE == "cuda" else host
    slot_of = torch.full((U + 1,), -1, dtype=torch.int32)
    slot_of[U] = S
    unit_in = torch.full((S + 1,), -1, dtype=torch.long)
    unit_in[S] = U
    st = LayerState(slot_of.to(DEVICE), unit_in.to(DEVICE),
                    torch.full((S + 1,), -1, dtype=torch.long, device=DEVICE),
                    torch.zeros(S + 1, dtype=torch.long, device=DEVICE), host,
                    torch.zeros(S + 1, 2, P, D, device=DEVICE),
                    torch.full((U + 1,), NO_CLAIM, dtype=torch.long, device=DEVICE),
                    torch.zeros((), dtype=torch.long, device=DEVICE))  # fmt: skip
    rest = {"acc": torch.zeros(len(_C), dtype=torch.long, device=DEVICE)}
    return st, rest


def clone(st: LayerState, rest: dict) -> tuple[LayerState, dict]:
    t = {f: getattr(st, f) for f in st.__dataclass_fields__}
    t = {f: (v.clone() if torch.is_tensor(v) and f != "host_units" else v) for f, v in t.items()}
    return LayerState(**t), {k: v.clone() for k, v in rest.items()}


def random_steps(n: int, U: int, st: LayerState, seed: int, steps: int = 24):
    """Each step's (units [n], valid [n], stage or None) on the device: a page shared by
    two sequences, every third step half the entries from a few pages (locality), every
    other step a prefetch's stage holding some units (rows unlike the host's, so that a
    slot filled from the stage shows it)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, 2, st.slots.shape[2], st.slots.shape[3], generator=g).to(DEVICE)
    for step in range(steps):
        units = torch.randint(0, U, (n,), generator=g)
        units[5] = units[4]
        if step % 3 == 0:
            units[: n // 2] = torch.randint(0, U // 8, (n // 2,), generator=g)
        valid = torch.rand(n, generator=g) < 0.8
        stage = None
        if step % 2:
            stage_of = torch.full((U + 1,), NOT_STAGED, dtype=torch.int32)
            pick = torch.randperm(U, generator=g)[: n // 3]
            stage_of[pick] = torch.randperm(n, generator=g)[: n // 3].to(torch.int32)
            stage = Stage(rows, stage_of.to(DEVICE))
        yield units.to(DEVICE), valid.to(DEVICE), stage


@needs_triton
@pytest.mark.parametrize("victims_kernel", [True, False])  # False: a Triton without it
@pytest.mark.parametrize("n", [20, 1500])  # one block of entries, and several
def test_kernels_match_the_reference(n, victims_kernel):
    allocator = SlotAllocator()
    allocator.victims_kernel = victims_kernel
    S, U = (30, 120) if n == 20 else (1600, 5000)
    a, ra = state(S, U)
    b, rb = clone(a, ra)
    for step, (units, valid, stage) in enumerate(random_steps(n, U, a, seed=n)):
        for s in (a, b):
            s.clock += 1
        got = allocate_triton(a, units, valid, ra["acc"], _C, stage=stage,
                              victims=allocator.victims)  # fmt: skip
        want = allocate_reference(b, units, valid, rb["acc"], _C, stage=stage)
        assert torch.equal(got.cpu(), want.cpu())
        for f in ("slot_of", "unit_in", "last_used", "uses", "slots"):
            x, y = getattr(a, f), getattr(b, f)
            end = a.scratch_unit if f == "slot_of" else a.scratch_slot  # scratch aside
            assert torch.equal(x[:end].cpu(), y[:end].cpu()), (step, f)
        assert torch.equal(ra["acc"].cpu(), rb["acc"].cpu()), step
        for s in (a, b):  # claims end with the call (the next one starts clean)
            assert (s.claim == NO_CLAIM).all()
    acc = ra["acc"].cpu()
    assert acc[_C["evicted"]] > 0 and acc[_C["prefetch_hits"]] > 0 and acc[_C["locality_hits"]] > 0
    assert acc[_C["fetched"]] == acc[_C["demand_fetched"]]  # (staged ones counted by no one here)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("S1,chunk", [(40, 1024), (300, 64), (1100, 1024)])
def test_victims_kernels_match_reference(S1, chunk):
    """The m least valuable slots (m: the owners' count, 0 to all), ties taken from the
    lowest slot, in slot order: the radix-select kernels against the torch reference (one
    program, 5 programs with the last one partial, 2 of the engine's chunks)."""
    from kernels.tier_alloc import least_valuable
    from kernels.tier_victims import victims_triton

    g = torch.Generator().manual_seed(S1)
    n = 24
    # few distinct values (many ties), spread over all four bytes, some protected
    value = (torch.randint(0, 6, (S1,), generator=g) * 0x01010101 // 3).to(torch.int32)
    value[torch.randperm(S1, generator=g)[:5]] = torch.iinfo(torch.int32).max
    for m in (0, 1, 7, n):
        owner = torch.zeros(n, dtype=torch.long)
        owner[torch.randperm(n, generator=g)[:m]] = 1
        ref = least_valuable(value, owner)[:m]
        got = victims_triton(value.to(DEVICE), torch.cumsum(owner, 0).to(DEVICE), S1, n,
                             chunk=chunk)  # fmt: skip
        assert torch.equal(got[:m].cpu(), ref), (m, got[:m], ref)
        assert (ref.diff() > 0).all()  # slot order
        # the m least valuable: nothing left out is below the largest taken
        left = torch.ones(S1, dtype=torch.bool)
        left[ref] = False
        if m:
            assert value[left].min() >= value[ref].max()
