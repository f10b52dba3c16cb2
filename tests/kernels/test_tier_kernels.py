"""The tier kernels against their references: page gather (UVA kernel and copy-engine
path) and the KV append that writes host, GPU slot and key summaries."""

from __future__ import annotations

import pytest
import torch

from kernels import HAS_TRITON, INTERPRET
from kernels.fp8 import FP8, to_fp8
from kernels.kv_append import append_kv, append_kv_reference
from kernels.page_score import empty_summaries
from kernels.uva_gather import gather_copy_engine, gather_pages, gather_reference
from kernels.views import (
    Counters,
    GatherLaunch,
    PageTable,
    Resident,
    RowPlaces,
    Selected,
    SlotTable,
    Stage,
)
from tests.triton_marks import DEVICE, needs_triton


def pools(dtype, P=16, D=64, U=23, S=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    host = torch.randn(U, 2, P, D, generator=g).to(dtype)
    if DEVICE == "cuda":
        host = host.pin_memory()
    gpu = torch.zeros(S, 2, P, D, dtype=dtype, device=DEVICE)
    return host, gpu, g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["kernel", "copy engine"])
def test_gather_moves_exactly_the_listed_pages(dtype, path):
    if path == "kernel" and not (HAS_TRITON and (INTERPRET or DEVICE == "cuda")):
        pytest.skip("needs triton")
    host, gpu, g = pools(dtype)
    src = torch.tensor([7, 0, 22, 3, 3], dtype=torch.int32)
    dst = torch.tensor([1, 8, 0, 4, 5], dtype=torch.int32)
    expected = gpu.clone()
    gather_reference(host, expected, src, dst)
    if path == "kernel":
        gather_pages(host, gpu, src.to(DEVICE), dst.to(DEVICE), GatherLaunch(2, 2, True))
    else:
        gather_copy_engine(host, gpu, src, dst.to(DEVICE))
    torch.cuda.synchronize() if DEVICE == "cuda" else None
    assert torch.equal(gpu.cpu(), expected.cpu())
    assert torch.equal(gpu[1].cpu(), host[7]) and gpu[2].abs().sum() == 0  # untouched slot


@needs_triton
def test_gather_skips_entries_without_a_destination():
    """A fixed-size fetch list (the engine's, built on the device) marks unused entries -1."""
    host, gpu, _ = pools(torch.float32)
    src = torch.tensor([7, 9, 22, 3], dtype=torch.int32)
    dst = torch.tensor([1, -1, 0, -1], dtype=torch.int32)
    expected = gpu.clone()
    gather_reference(host, expected, src, dst)
    gather_pages(host, gpu, src.to(DEVICE), dst.to(DEVICE), GatherLaunch(3, use_triton=True))
    assert torch.equal(gpu.cpu(), expected.cpu())
    assert torch.equal(gpu[0].cpu(), host[22]) and gpu[2:].abs().sum() == 0


@needs_triton
@pytest.mark.parametrize("live", [0, 3, 7])
def test_gather_walks_only_the_counted_entries(live):
    """With `count`, only the list's first `count` entries are read (the allocator compacts
    its fetch list on the device): entries past it are never copied, even where valid."""
    host, gpu, _ = pools(torch.float32)
    src = torch.tensor([7, 9, 22, 3, 11, 5, 13, 2, 4], dtype=torch.int32)
    dst = torch.tensor([1, 6, 0, 3, 4, 2, 5, 7, 8], dtype=torch.int32)
    expected = gpu.clone()
    gather_reference(host, expected, src[:live], dst[:live])
    count = torch.tensor([live], dtype=torch.long, device=DEVICE)
    gather_pages(host, gpu, src.to(DEVICE), dst.to(DEVICE), GatherLaunch(2, 2, True), count=count)
    assert torch.equal(gpu.cpu(), expected.cpu())


def append_case(seed=0, Hkv=3, D=64, P=16):
    g = torch.Generator().manual_seed(seed)
    # 9 rows: three into page 2 (one call, same page: the summary merges them), others
    # scattered; page 5's units have GPU slots for heads 0 and 2 only
    pages = torch.tensor([2, 2, 2, 5, 5, 0, 7, 7, 1], dtype=torch.int32)
    offs = torch.tensor([0, 1, 2, 14, 15, 3, 0, 9, 15], dtype=torch.int32)
    k = torch.randn(9, Hkv, D, generator=g)
    v = torch.randn(9, Hkv, D, generator=g)
    slots = torch.full((9, Hkv), -1, dtype=torch.int32)
    slots[3:5, 0], slots[3:5, 2] = 4, 1
    slots[0:3, 1] = 0
    return k, v, pages, offs, slots


@needs_triton
@pytest.mark.parametrize("with_gpu", [True, False])
def test_append_matches_reference(with_gpu):
    Hkv, D, P, U = 3, 64, 16, 8 * 3
    k, v, pages, offs, slots = append_case(Hkv=Hkv, D=D, P=P)
    results = []
    dev = torch.device(DEVICE)
    k, v, pages, offs, slots = (t.to(dev) for t in (k, v, pages, offs, slots))
    for use_triton in (True, False):
        host = torch.zeros(U, 2, P, D)
        host = host.pin_memory() if DEVICE == "cuda" else host  # the host tier, via UVA
        gpu = torch.zeros(6, 2, P, D, device=dev) if with_gpu else None
        summ = empty_summaries(U, D, dev)
        append_kv(k, v, host, gpu, RowPlaces(pages, offs), slots if with_gpu else None, summ,
                  use_triton=use_triton)  # fmt: skip
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        results.append((host, gpu, summ))
    k, v = k.cpu(), v.cpu()
    results = [(h, None if g is None else g.cpu(), s.cpu()) for h, g, s in results]
    (h1, g1, s1), (h2, g2, s2) = results
    assert torch.equal(h1, h2) and torch.allclose(s1, s2, atol=1e-5)
    if with_gpu:
        assert torch.equal(g1, g2)
    # the reference itself: rows landed, summaries hold min/max/sum of page 2's three rows
    assert torch.equal(h2[2 * Hkv + 1, 0, 1], k[1, 1]) and torch.equal(
        h2[5 * Hkv + 2, 1, 15], v[4, 2]
    )
    rows = k[0:3, 0]
    assert torch.equal(s2[2 * Hkv + 0, 0], rows.amin(0)) and torch.equal(
        s2[2 * Hkv, 1], rows.amax(0)
    )
    assert torch.allclose(s2[2 * Hkv, 2], rows.sum(0))
    if with_gpu:
        assert torch.equal(g2[4, 0, 14], k[3, 0]) and torch.equal(g2[0, 1, 2], v[2, 1])
        assert g2[2].abs().sum() == 0
    assert s2[3 * Hkv, 0, 0] == float("inf")  # page 3 got no row: still empty


def test_append_reference_on_cpu_without_triton():
    Hkv, D, P = 3, 64, 16
    k, v, pages, offs, _ = append_case(Hkv=Hkv, D=D, P=P)
    host, summ = torch.zeros(8 * Hkv, 2, P, D), empty_summaries(8 * Hkv, D)
    append_kv_reference(k, v, host, None, RowPlaces(pages, offs), None, summ)
    assert torch.equal(host[7 * Hkv + 1, 0, 9], k[7, 1])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (fp8 tensors compare as their bytes)."""
    as_bits = (lambda t: t.view(torch.uint8)) if a.dtype == FP8 else (lambda t: t)
    return a.dtype == b.dtype and torch.equal(as_bits(a), as_bits(b))


@needs_triton
@pytest.mark.parametrize("layout", ["quest bf16", "mean", "all three", "fp8 slots", "fp8 both"])
@pytest.mark.parametrize("fold", [True, False])
def test_tier_append_matches_reference(layout, fold):
    """The tiered cache's append (one program per row and head, no atomics; rows in
    distinct pages): GPU slots where the unit has one, summaries folded, a row at offset 0
    restarting its page's summary; the kernel against the torch ops, bit for bit."""
    from kernels.kv_append import tier_append
    from kernels.page_score import summary_rows

    Hkv, D, P, U, S = 3, 64, 16, 8 * 3, 7
    fp8 = layout.startswith("fp8")
    mode = {"mean": "mean", "all three": None}.get(layout, "quest")
    dtype = torch.bfloat16 if layout == "quest bf16" else torch.float32
    g = torch.Generator().manual_seed(1)
    pages = torch.tensor([2, 5, 0, 7, 1], dtype=torch.int32)  # distinct
    offs = torch.tensor([0, 15, 3, 0, 9], dtype=torch.int32)  # pages 2 and 7 start again
    k = torch.randn(5, Hkv, D, generator=g).to(dtype)
    v = torch.randn(5, Hkv, D, generator=g).to(dtype)
    slot_of = torch.full((U + 1,), -1, dtype=torch.int32)
    slot_of[torch.tensor([2 * 3, 5 * 3 + 2, 7 * 3 + 1])] = torch.tensor(
        [4, 0, 5], dtype=torch.int32
    )
    summ = empty_summaries(U + 1, D, mode=mode, dtype=FP8 if layout == "fp8 both" else dtype)
    summ[:] = torch.randn(summ.shape, generator=g).to(summ.dtype)  # earlier rows' statistics
    slots = torch.randn(S + 1, 2, P, D, generator=g).to(dtype)
    if fp8:  # (rows of any magnitude: some saturate)
        k, v, slots = k * 40, v * 40, to_fp8(slots)
    rows = summary_rows(mode)
    got = [t.to(DEVICE) for t in (slots, summ)]
    want = [t.clone() for t in (slots, summ)]
    args = [t.to(DEVICE) for t in (k, v)]
    idx = [t.to(DEVICE) for t in (slot_of, pages, offs)]
    tier_append(*args, SlotTable(got[0], idx[0]), got[1], RowPlaces(idx[1], idx[2]), rows, fold,
                use_triton=True)  # fmt: skip
    tier_append(k, v, SlotTable(want[0], slot_of), want[1], RowPlaces(pages, offs), rows, fold,
                use_triton=False)  # fmt: skip
    # (the reference writes rows without a slot to the scratch slot, and the other rows'
    # summary resets to the scratch unit; the kernel skips both)
    assert same(got[0][:S].cpu(), want[0][:S])
    assert same(got[1][:U].cpu(), want[1][:U])
    kv_of = to_fp8 if fp8 else (lambda x: x)
    assert same(want[0][4, 0, 0], kv_of(k[0, 0])) and same(want[0][5, 1, 0], kv_of(v[3, 1]))
    if fold and mode != "mean":  # a fresh page's min is its one row (as the slots hold it,
        # fp8 rows rounded); another page's merges
        assert same(want[1][2 * 3, 0], kv_of(k[0, 0]).to(want[1].dtype))
        assert not torch.equal(want[1][5 * 3, 0].float(), kv_of(k[1, 0]).float())


def test_fp8_summaries_fold_like_fp32_ones():
    """Rows of one page several times in a call (a prefill's), a fresh row among them, the
    scratch unit: folded into fp8 summaries, the result is the fp32 fold's, exactly (fp8
    keys: their min and max are fp8 values)."""
    from kernels.kv_append import fold_summaries
    from kernels.page_score import summary_rows

    g = torch.Generator().manual_seed(4)
    U, D = 9, 32
    units = torch.tensor([3, 3, 5, 3, 0, 5, 7, 7])
    fresh = torch.tensor([False, False, True, True, False, False, True, False])
    k = to_fp8(torch.randn(len(units), D, generator=g) * 50)  # (some saturate)
    rows = summary_rows("quest")
    wide = empty_summaries(U + 1, D, mode="quest")
    wide[:] = to_fp8(torch.randn(wide.shape, generator=g)).float()  # earlier rows' statistics
    narrow = to_fp8(wide)
    fold_summaries(wide, k.float(), units, fresh, U, rows)
    fold_summaries(narrow, k, units, fresh, U, rows)
    assert same(narrow[:U], to_fp8(wide[:U]))
    assert torch.equal(narrow[3, 0].float(), k[[0, 1, 3]].float().amin(0))  # all of them: 3 fresh
    assert torch.equal(narrow[0, 1].float(), torch.maximum(wide[0, 1], k[4].float()))
    empty = empty_summaries(2, D, mode="quest", dtype=FP8)
    fold_summaries(empty, k[:2], torch.tensor([1, 1]), torch.tensor([False, False]), 0, rows)
    assert torch.equal(empty[1, 0].float(), k[:2].float().amin(0))  # from the empty extremes


@needs_triton
@pytest.mark.parametrize("rows", [1, 4])
def test_gather_rounds_of_several_units_with_a_stage(rows):
    """Several units per program and round trip (rows), a list whose length is no multiple
    of it, skipped entries, and units a prefetch staged on the device (copied from there:
    the stage's rows differ from the host's, so the source shows)."""
    from kernels.uva_gather import NOT_STAGED

    host, gpu, g = pools(torch.float32)
    U = host.shape[0]
    n = 9  # (all the slots)
    src = torch.randperm(U, generator=g)[:n].to(torch.int32)
    dst = torch.randperm(gpu.shape[0], generator=g)[:n].to(torch.int32)
    dst[[2, 7]] = -1
    stage = torch.randn(5, *host.shape[1:], generator=g)
    stage_of = torch.full((U,), NOT_STAGED, dtype=torch.int32)
    stage_of[src[[0, 3, 7, 8]].long()] = torch.tensor([4, 0, 2, 1], dtype=torch.int32)
    expected = gpu.cpu()
    gather_reference(host, expected, src, dst, Stage(stage, stage_of))
    gather_pages(host, gpu, src.to(DEVICE), dst.to(DEVICE), GatherLaunch(2, rows, True),
                 Stage(stage.to(DEVICE), stage_of.to(DEVICE)))  # fmt: skip
    assert torch.equal(gpu.cpu(), expected.cpu())
    assert torch.equal(gpu[dst[0]].cpu(), stage[4]) and torch.equal(gpu[dst[1]].cpu(), host[src[1]])


@needs_triton
def test_stage_kernel_matches_reference():
    """A prefetch's staging (kernels.uva_gather.stage_pages): the same units staged (once
    each, duplicates included: two sequences share a page), the same page ids, counters and
    cleanup list as the torch reference; units resident, past counts or on the pages being
    written are left out. Which listing's row holds a duplicate may differ: compared by
    content."""
    from kernels.uva_gather import NOT_STAGED, stage_pages, stage_pages_reference

    g = torch.Generator().manual_seed(3)
    B, Hkv, W, M, P, D = 2, 2, 5, 8, 4, 16
    U = 6 * 8 * Hkv  # 48 pages of 2 heads
    host = torch.randn(U + 1, 2, P, D, generator=g)
    host = host.pin_memory() if DEVICE == "cuda" else host
    tables = torch.stack([torch.randperm(40, generator=g)[:M] for _ in range(B)]).to(torch.int32)
    tables[1, 3] = tables[0, 2]  # a shared page: its units are listed twice
    lens = torch.tensor([30, 21], dtype=torch.int32)  # pages 7 / 5 are being written
    pages = torch.tensor([[[0, 2, 3, 7, 1], [2, 4, 5, 0, 0]],
                          [[3, 1, 5, 6, 0], [3, 2, 0, 0, 0]]], dtype=torch.int32)  # fmt: skip
    counts = torch.tensor([[5, 3], [4, 2]], dtype=torch.int32)
    slot_of = torch.full((U + 1,), -1, dtype=torch.int32)
    slot_of[tables[0, 3].long() * Hkv] = 4  # resident: not staged
    slot_of[U] = 9  # the scratch unit
    out = {}
    for name, fn in (("kernel", stage_pages), ("reference", stage_pages_reference)):
        stage = torch.zeros(B * Hkv * W + 1, 2, P, D)
        stage_of = torch.full((U + 1,), NOT_STAGED, dtype=torch.int32)
        acc = torch.zeros(4, dtype=torch.long)
        st = Stage(stage.to(DEVICE), stage_of.to(DEVICE))
        counters = Counters(acc.to(DEVICE), (0, 1, 3))
        args = [host, st, Selected(pages.to(DEVICE), counts.to(DEVICE)),
                PageTable(tables.to(DEVICE), lens.to(DEVICE), P), Resident(slot_of.to(DEVICE), U),
                1, counters]  # fmt: skip
        kw = {"launch": GatherLaunch(2, use_triton=True)} if name == "kernel" else {}
        at, ids = fn(*args, **kw)
        stage, stage_of, acc = st.rows.cpu(), st.row_of.cpu(), counters.acc.cpu()
        staged = (stage_of != NOT_STAGED).nonzero().flatten()
        for unit in staged.tolist():
            assert torch.equal(stage[stage_of[unit]], host[unit]), (name, unit)
        out[name] = (set(staged.tolist()), ids.cpu(), at.cpu(), acc)
    k, ref = out["kernel"], out["reference"]
    assert k[0] == ref[0] and len(k[0]) == ref[3][0]
    assert torch.equal(k[1], ref[1]) and torch.equal(k[2], ref[2]) and torch.equal(k[3], ref[3])
    assert U not in k[0] and (tables[0, 3].long() * Hkv).item() not in k[0]
    # listed: 9 + 6 entries; resident 1, on written pages: (0, 7) x1, (1, 5) x1
    assert ref[3].tolist() == [len(k[0]), len(k[0]), 0, len(k[0])] and len(k[0]) > 5
