"""GPU-tier slot allocation for one layer of a sparse decode step (engine.kv.TieredKV):
make every listed (page, head) unit resident, taking the least valuable slots that the step
does not read, and fetch the missing units from the host tier. Everything stays on the
device with fixed shapes, so a decode step can be a CUDA graph.

State of the layer (all on the device; index S of the slot tables and U of the page table
are scratch entries):
- slot_of [U + 1] int32: each unit's slot, or -1;
- unit_in [S + 1] int64: each slot's unit, or -1 (free);
- last_used [S + 1] int64: the decode step that last read the slot (-1: never);
  uses [S + 1] int64: how often it was read;
- claim [U + 1] int64: a scratch table, NO_CLAIM everywhere between calls: the first
  entry that lists a unit owns it (an atomic min: the same owner on any device, in any
  program order; the reference takes the same one);
- clock [] int64: the current decode step;
- counters: the tiered cache's device counters, with the indices of the counts it adds.

A slot's value for eviction is an int32: its recency (the last read's step relative to
the current one, over the last RECENCY_STEPS steps; older and free slots: 0) * 2^20 +
min(uses, 2^20 - 1): free slots first, then the oldest last read, then the fewest reads;
the slots the step reads are protected (the int32 maximum). Int32: the victims' top-k is 4
radix passes, not 8 (87 us per layer with int64 at 20,481 slots on the H200).

Kernels (`allocate_triton`; `allocate_reference` is the same in ~45 torch ops; which one a
step runs, and the fallback for a Triton that cannot build the victims kernels, is the
engine's choice: engine.kv.residency):
1. `_value_kernel`: each slot's value; the scratch slot protected;
2. `_resolve_kernel` (per entry): its unit and current slot, its claim on the unit, the
   protection of the slot it reads, its locality hit (read at the step before);
3. `_owner_kernel` (per entry): whether it fetches (its unit's first listing, missing), and
   a cumsum of those (the owners' ranks; the last: their count m);
4. the victims, `victims_triton`: the m least valuable slots (ties: the lowest), in slot
   order, from a radix select over chunks of 1,024 slots, one program each (4 byte-wide
   histogram rounds, `_victims_hist_kernel`, then a count and a write pass; torch.topk of
   n sorted took ~49 us per layer at 20,481 slots on the H200, the same select in one
   program 102 us). Then `_assign_kernel` (per entry): the r-th owner takes the r-th
   victim, evicts its unit, updates both tables, writes the fetch list;
5. the UVA gather (kernels.uva_gather);
6. `_finish_kernel` (per entry): the final slots, and each read slot's recency and count.
The torch version of a layer took ~50 kernels; this takes 15. Status: the kernels match the reference bit for bit in the Triton interpreter and on the
H200 (tests/kernels/test_tier_alloc.py; in the engine 128K decode went from 43.9 to 58.2
tok/s, bench.e2e_sparse), so they are the engine's path on GPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels import HAS_TRITON
from kernels.tier_victims import victims_triton
from kernels.uva_gather import NOT_STAGED, gather_pages
from kernels.views import GATHER_PROGRAMS, GatherLaunch, Stage

NEVER = torch.iinfo(torch.int32).max  # a protected slot's value
NO_CLAIM = torch.iinfo(torch.long).max
USES_BITS = 20
RECENCY_STEPS = (1 << 11) - 2  # steps of recency a value tells apart (31 bits in all)


@dataclass
class LayerState:
    slot_of: torch.Tensor  # [U + 1] int32
    unit_in: torch.Tensor  # [S + 1] int64
    last_used: torch.Tensor  # [S + 1] int64
    uses: torch.Tensor  # [S + 1] int64
    host_units: torch.Tensor  # [U + 1, 2, P, D]: the host tier (pinned on a GPU run)
    slots: torch.Tensor  # [S + 1, 2, P, D]: the GPU tier
    claim: torch.Tensor  # [U + 1] int64, NO_CLAIM between calls (shared by every layer)
    clock: torch.Tensor  # [] int64: the decode step (shared by every layer)
    gather_programs: int = GATHER_PROGRAMS  # the fetch's programs (EngineConfig)
    # the CLOCK eviction's (kernels.tier_clock): each slot's last reading step, the hand
    marks: torch.Tensor | None = None  # [S + 1] int32
    hand: torch.Tensor | None = None  # [] int64

    @property
    def scratch_slot(self) -> int:  # (the last entries are scratch)
        return self.unit_in.shape[0] - 1

    @property
    def scratch_unit(self) -> int:
        return self.slot_of.shape[0] - 1


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _value_kernel(LAST, USES, CLOCK, VALUE, S, SCRATCH, BLOCK: tl.constexpr,
                      USES_BITS: tl.constexpr, RECENCY: tl.constexpr):  # fmt: skip
        s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = s < S
        last = tl.load(LAST + s, mask=m, other=0)
        rec = tl.minimum(tl.maximum(last - tl.load(CLOCK) + RECENCY, 0), RECENCY)
        uses = tl.minimum(tl.load(USES + s, mask=m, other=0), (1 << USES_BITS) - 1)
        value = (rec * (1 << USES_BITS) + uses).to(tl.int32)
        value = tl.where(s == SCRATCH, 2147483647, value)
        tl.store(VALUE + s, value, mask=m)

    @triton.jit
    def _resolve_kernel(
        UNITS, VALID, SLOT_OF, CLAIM, VALUE, LAST, CLOCK, U_OUT, SLOT_OUT, ACC,
        n, SCRATCH_UNIT, C_HITS, C_TOTAL, BLOCK: tl.constexpr, MARK_CLOCK: tl.constexpr = False,
    ):  # fmt: skip
        """MARK_CLOCK: a read slot's VALUE becomes the step (int32) instead of protected
        (kernels.tier_clock's marks)."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        valid = tl.load(VALID + i, mask=m, other=0) != 0
        u = tl.where(valid, tl.load(UNITS + i, mask=m, other=0), SCRATCH_UNIT)
        slot = tl.load(SLOT_OF + u, mask=m, other=-1).to(tl.int64)
        resident = slot >= 0
        tl.store(U_OUT + i, u, mask=m)
        tl.store(SLOT_OUT + i, slot, mask=m)
        tl.atomic_min(CLAIM + u, i.to(tl.int64), mask=m)  # the first entry owns the unit
        if MARK_CLOCK:
            tl.store(VALUE + slot, tl.load(CLOCK).to(tl.int32), mask=m & resident)
        else:
            tl.store(VALUE + slot, 2147483647, mask=m & resident)  # the step reads it
        # locality: read by this layer at the step before
        last = tl.load(LAST + slot, mask=m & resident, other=-2)
        clock = tl.load(CLOCK)
        hit = m & valid & resident & (last == clock - 1)
        tl.atomic_add(ACC + C_HITS, tl.sum(hit.to(tl.int64), 0))
        tl.atomic_add(ACC + C_TOTAL, tl.sum((m & valid).to(tl.int64), 0))

    @triton.jit
    def _owner_kernel(U_IN, SLOT_IN, CLAIM, OWNER, n, BLOCK: tl.constexpr):
        """The entries that fetch: a missing unit's first listing (claims are complete now)."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        u = tl.load(U_IN + i, mask=m, other=0)
        missing = tl.load(SLOT_IN + i, mask=m, other=0) < 0
        owner = m & missing & (tl.load(CLAIM + u, mask=m, other=-1) == i)
        tl.store(OWNER + i, owner.to(tl.int64), mask=m)

    @triton.jit
    def _take_victims(U_IN, RANK, VICTIMS, SLOT_OF, UNIT_IN, USES, SRC, DST, i, m, total,
                      BLOCK: tl.constexpr):  # fmt: skip
        """Entries i (where m): owner r-th in entry order (RANK: the inclusive count of
        owners) takes victim r, evicting its unit; the fetch list is compacted: owner r at
        entry r - 1 of SRC / DST, and -1 in DST from entry `total` (the owners) on, so the
        gather walks only the owners. Returns (owner, evicted, dst)."""
        rank = tl.load(RANK + i, mask=m, other=0)
        before = tl.load(RANK + i - 1, mask=m & (i > 0), other=0)
        owner = m & (rank > before)
        u = tl.load(U_IN + i, mask=m, other=0)
        dst = tl.load(VICTIMS + rank - 1, mask=owner, other=0)
        old = tl.load(UNIT_IN + dst, mask=owner, other=-1)
        evicted = owner & (old >= 0)
        tl.store(SLOT_OF + old, -1, mask=evicted)
        tl.store(SLOT_OF + u, dst.to(tl.int32), mask=owner)
        tl.store(UNIT_IN + dst, u, mask=owner)
        tl.store(USES + dst, 0, mask=owner)
        tl.store(SRC + rank - 1, u.to(tl.int32), mask=owner)
        tl.store(DST + rank - 1, dst.to(tl.int32), mask=owner)
        past = m & (i >= total)  # (entries below `total` are owners' places)
        tl.store(SRC + i, tl.zeros([BLOCK], tl.int32), mask=past)
        tl.store(DST + i, tl.full([BLOCK], -1, tl.int32), mask=past)
        return owner, evicted, dst

    @triton.jit
    def _assign_kernel(
        U_IN, RANK, VICTIMS, SLOT_OF, UNIT_IN, USES, SRC, DST, ACC, n,
        C_FETCHED, C_EVICTED, C_DEMAND, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """The owners take the least valuable slots (_take_victims). Programs touch
        disjoint slots and units: owners' victims are distinct, and an evicted unit is never
        a missing one (resident units the step reads are protected)."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        total = tl.load(RANK + n - 1)
        owner, evicted, dst = _take_victims(U_IN, RANK, VICTIMS, SLOT_OF, UNIT_IN, USES, SRC,
                                            DST, i, m, total, BLOCK)  # fmt: skip
        fetched = tl.sum(owner.to(tl.int64), 0)
        tl.atomic_add(ACC + C_FETCHED, fetched)
        tl.atomic_add(ACC + C_DEMAND, fetched)
        tl.atomic_add(ACC + C_EVICTED, tl.sum(evicted.to(tl.int64), 0))

    @triton.jit
    def _finish_kernel(
        U_IN, SLOT_OF, LAST, USES, CLOCK, CLAIM, OUT, n, SCRATCH_SLOT, BLOCK: tl.constexpr,
    ):  # fmt: skip
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        u = tl.load(U_IN + i, mask=m, other=0)
        slot = tl.load(SLOT_OF + u, mask=m, other=0)
        tl.store(OUT + i, slot, mask=m)
        tl.store(CLAIM + u, 9223372036854775807, mask=m)  # claims end with the call
        # read at this step (not the scratch slot: its value is protected anyway)
        real = m & (slot != SCRATCH_SLOT)
        tl.store(LAST + slot, tl.load(CLOCK), mask=real)
        tl.atomic_add(USES + slot, tl.full([BLOCK], 1, tl.int64), mask=real)


def allocate_triton(st: LayerState, units: torch.Tensor, valid: torch.Tensor, acc: torch.Tensor,
                    counters: dict[str, int], stage: Stage | None = None,
                    before_gather: Callable[[], None] | None = None,
                    victims: Callable | None = None) -> torch.Tensor:  # fmt: skip
    """Make `units` [n] int64 resident where `valid` [n] bool (the others read the scratch
    slot). Returns their slots [n] int32.
    `counters`: the indices in `acc` of fetched, evicted, demand_fetched, locality_hits
    and locality_total (and prefetch_hits, prefetch_waste with a stage). `stage`: (rows
    [R, 2, P, D], row_of [U + 1] int32) of units a Forecast prefetch has already copied
    to the device (kernels.uva_gather): those fill their slots from there, and count as
    prefetch hits instead of fetches. `before_gather`: called just before the first read of
    the stage (the wait for the prefetch's stream), so everything before it runs beside the
    prefetch. `victims(value, owner, rank, S1, n)`: the victims' select (None:
    victims_triton)."""
    claim, clock = st.claim, st.clock
    n, dev = units.numel(), units.device
    S1 = st.unit_in.shape[0]
    # the callers' capacity check: a step never reads more units than there are slots
    assert n <= S1 - 1, f"{n} entries for {S1 - 1} slots"
    value = torch.empty(S1, dtype=torch.int32, device=dev)
    B = 1024
    _value_kernel[(triton.cdiv(S1, B),)](st.last_used, st.uses, clock, value, S1,
                                         st.scratch_slot, BLOCK=B, USES_BITS=USES_BITS,
                                         RECENCY=RECENCY_STEPS)  # fmt: skip
    u = torch.empty(n, dtype=torch.long, device=dev)
    slot_in = torch.empty(n, dtype=torch.long, device=dev)
    _resolve_kernel[(triton.cdiv(n, B),)](
        units, valid, st.slot_of, claim, value, st.last_used, clock, u, slot_in, acc,
        n, st.scratch_unit, counters["locality_hits"], counters["locality_total"], BLOCK=B,
        MARK_CLOCK=False,
    )  # fmt: skip
    owner = torch.empty(n, dtype=torch.long, device=dev)
    _owner_kernel[(triton.cdiv(n, B),)](u, slot_in, claim, owner, n, BLOCK=B)
    rank = torch.cumsum(owner, 0)
    victims_at = (victims(value, owner, rank, S1, n) if victims is not None
                  else victims_triton(value, rank, S1, n))  # fmt: skip
    src = torch.empty(n, dtype=torch.int32, device=dev)
    dst = torch.empty(n, dtype=torch.int32, device=dev)
    _assign_kernel[(triton.cdiv(n, B),)](
        u, rank, victims_at, st.slot_of, st.unit_in, st.uses, src, dst, acc, n,
        counters["fetched"], counters["evicted"], counters["demand_fetched"], BLOCK=B,
    )  # fmt: skip
    _gather(st, src, dst, acc, counters, stage, before_gather, rank[n - 1 :])
    out = torch.empty(n, dtype=torch.int32, device=dev)
    _finish_kernel[(triton.cdiv(n, B),)](u, st.slot_of, st.last_used, st.uses, clock, claim,
                                         out, n, st.scratch_slot, BLOCK=B)  # fmt: skip
    return out


def _gather(st, src, dst, acc, counters, stage, before_gather, count=None) -> None:
    """The fetch list's gather (src units -> dst slots, -1: none), from the stage where a
    prefetch put the unit: those count as prefetch hits, not as fetches on the critical
    path (the prefetch counted their transfer). `count`: live entries lead the list."""
    if before_gather is not None:
        before_gather()
    if stage is None:
        return gather_pages(st.host_units, st.slots, src, dst, GatherLaunch(st.gather_programs),
                            count=count)  # fmt: skip
    # mostly device-to-device copies (the staged units) and a few host reads: more programs
    gather_pages(st.host_units, st.slots, src, dst, GatherLaunch(4 * st.gather_programs),
                 stage=stage, count=count)  # fmt: skip
    hits = ((dst >= 0) & (stage.row_of[src.long()] != NOT_STAGED)).sum()
    acc[counters["prefetch_hits"]] += hits
    for name in ("fetched", "demand_fetched", "prefetch_waste"):
        acc[counters[name]] -= hits


def allocate_reference(st, units, valid, acc, counters, stage=None, before_gather=None,
                       victims: Callable | None = None):  # fmt: skip
    """The same in torch ops (the CPU engine's path). `victims(st, slot, missing, owner)`:
    the owners' slots in rank order (None: the least valuable, `value_victims`)."""
    dev, n = units.device, units.numel()
    claim, clock = st.claim, st.clock
    slot_of, unit_in, last_used, uses = st.slot_of, st.unit_in, st.last_used, st.uses
    scratch_slot, scratch_unit = st.scratch_slot, st.scratch_unit
    u = torch.where(valid, units, scratch_unit)
    slot = slot_of[u].long()
    missing = slot < 0
    # one owner per missing unit (a page shared by two sequences appears twice): the first
    idx = torch.arange(n, device=dev)
    claim.scatter_reduce_(0, u, idx, "amin")
    owner = missing & (claim[u] == idx)
    claim.index_fill_(0, u, NO_CLAIM)
    victims = (victims or value_victims)(st, slot, missing, owner)
    rank = (torch.cumsum(owner, 0) - 1).clamp(min=0)
    dst = torch.where(owner, victims[rank], scratch_slot)
    old = unit_in[dst]
    evicted = owner & (old >= 0)
    slot_of.index_fill_(0, torch.where(evicted, old, scratch_unit), -1)
    slot_of[torch.where(owner, u, scratch_unit)] = dst.to(torch.int32)
    slot_of[scratch_unit].fill_(scratch_slot)
    unit_in[dst] = torch.where(owner, u, scratch_unit)
    uses.index_fill_(0, dst, 0)
    slot = slot_of[u].long()
    c = counters
    # (the counts first: _gather takes the staged units' fetches back)
    _count(acc, (c["fetched"], c["evicted"], c["demand_fetched"]), (owner, evicted, owner))
    _gather(st, torch.where(owner, u, 0).to(torch.int32), torch.where(owner, dst, -1).to(torch.int32),
            acc, counters, stage, before_gather)  # fmt: skip
    # locality: valid units that this layer also read at the step before
    hit = valid & ~missing & (last_used[slot] == clock - 1)
    _count(acc, (c["locality_hits"], c["locality_total"]), (hit, valid))
    # (index_fill_ with a tensor value reads it on the host: not in a CUDA graph)
    last_used.index_put_((slot,), clock.expand(slot.shape))
    uses.index_add_(0, slot, torch.ones_like(slot))
    return slot.to(torch.int32)


def value_victims(st, slot, missing, owner) -> torch.Tensor:
    """The least valuable slots, the step's resident slots protected (allocate_reference's
    victims)."""
    value = slot_values(st.last_used, st.uses, st.clock)
    value.index_fill_(0, torch.where(missing, st.scratch_slot, slot), NEVER)
    value[st.scratch_slot].fill_(NEVER)
    return least_valuable(value, owner)


def least_valuable(value: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """The victims (reference of victims_triton): the m least valuable slots, m = the
    owners' count, ties taken from the lowest slot, listed in slot order (then padding up
    to the owner tensor's length). Fixed shapes, no host read (CUDA graphs)."""
    n = owner.numel()
    m = owner.sum()
    first = torch.sort(value, stable=True).indices[:n]  # (value, slot) order
    at = torch.arange(n, device=value.device)
    return torch.sort(torch.where(at < m, first, value.numel())).values


def slot_values(last_used: torch.Tensor, uses: torch.Tensor, clock: torch.Tensor) -> torch.Tensor:
    """Each slot's eviction value, int32 (see the module's docstring)."""
    rec = (last_used - clock + RECENCY_STEPS).clamp(0, RECENCY_STEPS)
    return (rec * (1 << USES_BITS) + uses.clamp(max=(1 << USES_BITS) - 1)).to(torch.int32)


def _count(acc: torch.Tensor, where: tuple[int, ...], masks: tuple[torch.Tensor, ...]) -> None:
    # each mask's true count into its counter (no host-to-device copy: CUDA graphs)
    for i, mask in zip(where, masks, strict=True):
        acc[i] += mask.sum()
