"""The GPU tier's slot allocator (engine.kv.residency.Residency.ensure_resident), run on the CPU: after
any sequence of fetches the page table and the slot owners agree, every resident slot holds
exactly its page's rows from the host tier, the scratch entries stay put, and the slots
a step reads are never taken by that step's own misses."""

from __future__ import annotations

import pytest
import torch

from engine.kv import SparseConfig, TieredKV
from kernels.uva_gather import NOT_STAGED


def make(num_slots: int, pages: int = 40, L: int = 2, Hkv: int = 3, P: int = 16, D: int = 8,
         eviction: str = "value"):  # fmt: skip
    host = torch.randn(L, pages, Hkv, 2, P, D)
    unit_bytes = 2 * P * D * 4
    sp = SparseConfig(budget_fraction=0.1, gpu_kv_budget=num_slots * L * unit_bytes,
                      eviction=eviction)  # fmt: skip
    return TieredKV(host, P, sp, torch.device("cpu")), host


def check_consistent(t: TieredKV, host: torch.Tensor) -> None:
    for layer in range(t.L):
        unit_in = t.residency.unit_in[layer, : t.num_slots]
        held = (unit_in >= 0).nonzero().flatten()
        assert torch.equal(t.residency.slot_of[layer, unit_in[held]].long(), held)
        assert int((t.residency.slot_of[layer, : t.scratch_unit] >= 0).sum()) == len(held)
        units = host[layer].reshape(-1, 2, t.P, t.D)
        assert torch.equal(t.residency.slots[layer, held], units[unit_in[held]])
        assert int(t.residency.slot_of[layer, t.scratch_unit]) == t.scratch_slot
        assert int(t.residency.unit_in[layer, t.scratch_slot]) == t.scratch_unit


@pytest.mark.parametrize("eviction", ["value", "clock"])
def test_random_steps_keep_the_page_table_and_the_slots_exact(eviction):
    t, host = make(num_slots=24, eviction=eviction)
    g = torch.Generator().manual_seed(0)
    units_total = t.scratch_unit
    for _ in range(60):
        t.clock += 1
        for layer in range(t.L):
            n = 20  # entries of one step: some invalid, some repeated (shared pages)
            units = torch.randint(0, units_total, (n,), generator=g)
            units[5] = units[4]
            valid = torch.rand(n, generator=g) < 0.8
            slots = t.residency.ensure_resident(layer, units, valid)
            assert torch.equal(t.residency.slot_of[layer, units[valid]].long(), slots[valid].long())
            assert (slots[~valid] == t.scratch_slot).all()
            # this step's units are all resident and distinct units have distinct slots
            got = dict(zip(units[valid].tolist(), slots[valid].tolist(), strict=True))
            assert len(set(got.values())) == len(got)
            check_consistent(t, host)
    st = t.stats
    assert st.fetched > 0 and st.evicted > 0
    assert st.fetched - st.evicted == t.resident_units()  # no slot leaked or lost


def test_a_full_tier_evicts_the_oldest_pages_first():
    t, host = make(num_slots=6, L=1)
    for u in range(6):  # fill the tier, one page per step
        t.clock += 1
        t.residency.ensure_resident(0, torch.tensor([u]), torch.tensor([True]))
    t.clock += 1
    t.residency.ensure_resident(0, torch.tensor([0, 1, 10]), torch.tensor([True, True, True]))
    resident = set(t.residency.unit_in[0, : t.num_slots].tolist())
    assert {0, 1, 10} <= resident and 2 not in resident  # 2 was the oldest not read now
    check_consistent(t, host)


def test_deferred_rows_fold_and_dropped_pages_leave_every_layer():
    """A verification's rows fold into the summaries later (fold_rows, all layers at once):
    the summaries then equal those of the same rows appended one by one; drop_pages frees
    the pages' slots in every layer and counts them."""
    Hkv = 3
    rows = [(2, o) for o in range(14, 16)] + [(5, o) for o in range(0, 3)]  # across a page end
    summaries = []
    for deferred in (False, True):
        torch.manual_seed(0)  # the same host rows both times
        t, host = make(num_slots=24)
        for layer in range(t.L):  # earlier rows of page 2, folded as usual
            k = host[layer, 2, :, 0, :14].transpose(0, 1)  # [14, Hkv, D]
            t.after_append(layer, k, k, torch.full((14,), 2), torch.arange(14))
        t.defer_summaries = deferred
        for layer in range(t.L):
            pg = torch.tensor([p for p, _ in rows])
            off = torch.tensor([o for _, o in rows])
            k = host[layer, pg, :, 0, off]  # [5, Hkv, D]
            t.after_append(layer, k, k, pg, off)
        t.defer_summaries = False
        if deferred:
            before = t.selection.summ.clone()
            t.fold_rows([p for p, _ in rows], [o for _, o in rows])
            assert not torch.equal(before, t.selection.summ)
        summaries.append(t.selection.summ.clone())
    assert torch.equal(summaries[0], summaries[1])
    mn = summaries[1][:, 5 * Hkv : 6 * Hkv, 0]  # page 5's min: its 3 rows only
    assert torch.equal(mn, host[:, 5, :, 0, :3].amin(2))
    # drop: pages 2 and 5 resident in both layers, then dropped everywhere
    for layer in range(t.L):
        t.residency.ensure_resident(layer, torch.tensor([2 * Hkv, 5 * Hkv + 1, 7 * Hkv]),
                           torch.tensor([True, True, True]))  # fmt: skip
    t.drop_pages([2, 5])
    for layer in range(t.L):
        assert (t.residency.slot_of[layer, torch.tensor([2 * Hkv, 5 * Hkv + 1])] == -1).all()
        assert int(t.residency.slot_of[layer, 7 * Hkv]) >= 0
    assert t.stats.dropped == 2 * t.L
    check_consistent(t, host)


def test_a_prefetch_stages_missing_pages_and_the_step_fills_its_slots_from_there():
    """The Forecast prefetch copies the predicted pages that have no slot into a stage on
    the device, leaving out the page this step's row goes to (its host copy is being
    written); the exact step then fills its slots from the stage (hits) or from the host
    (the rest), and the stage table is clean afterwards. Here the host copy of the staged
    pages changes after the prefetch, so the slots show where each page came from."""
    t, host = make(num_slots=24, pages=12, L=1)
    t.forecast = object()
    P, Hkv, D = t.P, t.Hkv, t.D
    tables = torch.arange(12, dtype=torch.int32)[None]
    lens = torch.tensor([10 * P + 1], dtype=torch.int32)  # the row at offset 0 of page 10
    t.fold_rows([p for p in range(10) for _ in range(P)], list(range(P)) * 10)  # summaries
    t.end_step(max_len=int(lens[0]))
    t.clock += 1
    q = torch.randn(1, 1, Hkv, D)  # a perfect prediction: the step's own query
    t.prefetcher.prefetch(0, q, tables, lens)
    assert (t.residency.slot_of[0] == -1)[: t.scratch_unit].all()  # no slot taken by the prefetch
    staged = (t.prefetcher.stage_of[: t.scratch_unit] != NOT_STAGED).nonzero().flatten()
    pages = set((staged // Hkv).tolist())
    assert 0 in pages and 9 in pages and 10 not in pages  # sink, window; not the written one
    st = t.stats
    assert st.prefetched == st.fetched == len(staged) == st.prefetch_waste
    before = host.clone()
    host[0, 9] += 1.0  # changed on the host after the prefetch: page 9 comes from the stage
    t.attend(0, q, tables, lens, D**-0.5)
    for unit in range(10 * Hkv, 11 * Hkv):  # the written page: from the host, now
        assert torch.equal(
            t.residency.slots[0, t.residency.slot_of[0, unit]], host[0].reshape(-1, 2, P, D)[unit]
        )
    for unit in range(9 * Hkv, 10 * Hkv):
        assert torch.equal(
            t.residency.slots[0, t.residency.slot_of[0, unit]], before[0].reshape(-1, 2, P, D)[unit]
        )
    assert (t.prefetcher.stage_of == NOT_STAGED).all() and not t.prefetcher.staged
    st = t.stats
    assert st.prefetch_hits == st.prefetched and st.prefetch_waste == 0
    assert st.demand_fetched == Hkv  # the written page, one unit per head
    assert st.fetched == st.prefetched + st.demand_fetched


def test_slot_values_order_free_then_recency_then_reads_in_int32():
    """Eviction values are int32 (a cheaper top-k over the slots): free slots first, then
    the oldest last read (the last RECENCY_STEPS steps told apart; older ones tie), then
    the fewest reads; never the protected value, however many reads."""
    from kernels.tier_alloc import NEVER, RECENCY_STEPS, slot_values

    clock = torch.tensor(5000)
    last = torch.tensor([-1, 0, 100, 4000, 4999, 5000, 5000])
    uses = torch.tensor([0, 9, 9, 3, 1, 1, 2**40])
    v = slot_values(last, uses, clock)
    assert v.dtype == torch.int32 and (v < NEVER).all()
    assert v[0] < v[1] == v[2] < v[3] < v[4] < v[5] < v[6]  # 0 and 100: both too old
    assert RECENCY_STEPS < 5000 - 100


def test_the_eviction_is_a_checked_config_field_that_reconfigure_switches():
    t, host = make(num_slots=8, eviction="clock")
    assert t.residency.hand is not None and t.residency.layer(1).hand is not None
    with pytest.raises(ValueError, match="eviction must be value or clock"):
        SparseConfig(budget_fraction=0.1, eviction="lru")
    t.reconfigure(SparseConfig(budget_fraction=0.1, eviction="value"))
    assert t.residency.layer(0).hand is None
    for _ in range(3):  # both ways on one tier, the tables stay exact
        for eviction in ("clock", "value"):
            t.reconfigure(SparseConfig(budget_fraction=0.1, eviction=eviction))
            t.clock += 1
            units = torch.randint(0, t.scratch_unit, (6,))
            t.residency.ensure_resident(0, units, torch.ones(6, dtype=torch.bool))
            check_consistent(t, host)


def test_fp8_kv_is_a_checked_config_field_for_the_tiered_cache():
    from engine.config import EngineConfig

    assert EngineConfig().kv_dtype == "auto"
    with pytest.raises(ValueError, match="kv_dtype must be auto or fp8"):
        EngineConfig(kv_dtype="int8")
    with pytest.raises(ValueError, match="kv_dtype fp8 is for the tiered cache"):
        EngineConfig(kv_dtype="fp8")
    assert EngineConfig(kv_dtype="fp8", sparse=SparseConfig(budget_fraction=0.1)).kv_dtype == "fp8"


def test_the_allocator_implementation_is_a_checked_config_field():
    """EngineConfig.tier_alloc picks the GPU tier's allocation (no environment variable);
    anything but "triton" or "torch" is refused when the config is built."""
    from engine.config import EngineConfig

    assert EngineConfig().tier_alloc == "triton" and EngineConfig().verify_graphs
    assert EngineConfig(tier_alloc="torch").tier_alloc == "torch"
    with pytest.raises(ValueError, match="tier_alloc must be triton or torch"):
        EngineConfig(tier_alloc="cuda")


def test_the_gather_programs_are_a_checked_config_field_that_reaches_the_fetch():
    """EngineConfig.gather_programs (no environment variable): 16 by default, refused below
    1 when the config is built; the slot allocator hands it to each layer's fetch."""
    from engine.config import EngineConfig
    from engine.kv.residency import Residency, SlotAllocator

    assert (
        EngineConfig().gather_programs == 16
        and EngineConfig(gather_programs=4).gather_programs == 4
    )
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="gather_programs must be"):
            EngineConfig(gather_programs=bad)
    host = torch.zeros(2, 5, 3, 2, 16, 8)
    acc = torch.zeros(32, dtype=torch.long)
    res = Residency(host, 4, torch.device("cpu"), acc, SlotAllocator(gather_programs=3))
    assert res.layer(1).gather_programs == 3
    assert Residency(host, 4, torch.device("cpu"), acc).layer(0).gather_programs == 16
