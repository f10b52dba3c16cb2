"""Page gather between pools: copy page units (one page of one KV head: K rows then V rows,
2 * P * D elements) from a source pool into slots of a destination pool.

The source is the host tier: pinned host memory. With unified virtual addressing a pinned
allocation has a device address, so the Triton kernel reads it directly over PCIe, with no
staging copy; it runs on a bounded number of programs (`max_programs`, one per SM at most
when used beside other work), each looping over its share of the pages. The alternative is
`gather_copy_engine`: gather on the host into a pinned staging buffer, one DMA copy, then a
scatter on the device.

Pools are viewed as [units, 2, P, D]; `src_units[i]` goes to `dst_units[i]`.
"""

from __future__ import annotations

import torch

from kernels import HAS_TRITON, INTERPRET, host_pointer
from kernels.fp8 import FP8
from kernels.views import Counters, GatherLaunch, PageTable, Resident, Selected, Stage

NOT_STAGED = 2**31 - 1  # a stage table's entry for a unit that no prefetch staged
GATHER_ELEMENTS = 16384  # elements per program and round trip by default (32 KB of bf16)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _gather_kernel(
        SRC, DST, SRC_IDX, DST_IDX, STAGE, STAGE_OF, COUNT, n,
        E: tl.constexpr, EB: tl.constexpr, ROWS: tl.constexpr, NPROG: tl.constexpr,
        HAS_STAGE: tl.constexpr, NONE: tl.constexpr, HAS_COUNT: tl.constexpr,
    ):  # fmt: skip
        # persistent: each program walks its share, ROWS whole units at a time. Every load
        # of a round is issued before any store, so a program has ROWS * E elements in
        # flight over PCIe per round trip (one round trip per ROWS units, not per block):
        # a few programs then fill the link, and the rest of the GPU is left to the work
        # beside them
        pid = tl.program_id(0)
        r = tl.arange(0, ROWS)
        c = tl.arange(0, EB)
        in_unit = (c < E)[None, :]
        if HAS_COUNT:  # the live entries lead the list: walk only those
            n = tl.minimum(n, tl.load(COUNT).to(tl.int32))
        for base in range(pid * ROWS, n, NPROG * ROWS):
            i = base + r
            s = tl.load(SRC_IDX + i, mask=i < n, other=0).to(tl.int64)
            d = tl.load(DST_IDX + i, mask=i < n, other=-1).to(tl.int64)
            live = d >= 0  # -1: an unused entry of a fixed-size list
            m = live[:, None] & in_unit
            if HAS_STAGE:  # already on the device (a prefetch staged it): copy from there
                row = tl.load(STAGE_OF + s, mask=live, other=NONE).to(tl.int64)
                staged = (row != NONE)[:, None]
                x = tl.load(SRC + s[:, None] * E + c[None, :], mask=m & ~staged)
                y = tl.load(STAGE + row[:, None] * E + c[None, :], mask=m & staged)
                x = tl.where(staged, y, x)
            else:
                x = tl.load(SRC + s[:, None] * E + c[None, :], mask=m)
            tl.store(DST + d[:, None] * E + c[None, :], x, mask=m)

    @triton.jit
    def _stage_kernel(
        SRC, STAGE, PAGES, COUNTS, TABLES, LENS, SLOT_OF, STAGE_OF, AT, IDS, ACC,
        n, M, rows_written, scratch_unit, C_FETCHED, C_PREFETCHED, C_WASTE,
        HKV: tl.constexpr, W: tl.constexpr, P: tl.constexpr,
        E: tl.constexpr, EB: tl.constexpr, ROWS: tl.constexpr, NPROG: tl.constexpr,
        NONE: tl.constexpr,
    ):  # fmt: skip
        # one pass over a predicted selection (entry i: sequence i // (HKV * W), KV head
        # (i // W) % HKV, column i % W): its page id, whether its unit is wanted (listed, not
        # being written this step, not resident), a claim on the unit's stage entry (the
        # first claim wins: duplicates are staged once), and the claimed units' copy from
        # the host, ROWS units per round trip as in _gather_kernel
        pid = tl.program_id(0)
        r = tl.arange(0, ROWS)
        c = tl.arange(0, EB)
        in_unit = (c < E)[None, :]
        mine = tl.zeros([ROWS], tl.int64)
        for base in range(pid * ROWS, n, NPROG * ROWS):
            i = base + r
            im = i < n
            seq = i // (HKV * W)
            head = (i // W) % HKV
            col = tl.load(PAGES + i, mask=im, other=0)
            valid = im & ((i % W) < tl.load(COUNTS + i // W, mask=im, other=0))
            page = tl.load(TABLES + seq.to(tl.int64) * M + col, mask=valid, other=0).to(tl.int64)
            unit = page * HKV + head
            tl.store(IDS + i, tl.where(valid, page, -1).to(tl.int32), mask=im)
            length = tl.load(LENS + seq, mask=im, other=0)
            written = col >= (length - rows_written) // P
            want = valid & ~written
            want &= tl.load(SLOT_OF + unit, mask=want, other=0) < 0
            at = tl.where(want, unit, scratch_unit)
            tl.store(AT + i, at, mask=im)
            old = tl.atomic_cas(STAGE_OF + at, tl.where(want, NONE, -2), i.to(tl.int32))
            first = want & (old == NONE)
            m = first[:, None] & in_unit
            x = tl.load(SRC + unit[:, None] * E + c[None, :], mask=m)
            tl.store(STAGE + i.to(tl.int64)[:, None] * E + c[None, :], x, mask=m)
            mine += first.to(tl.int64)
        total = tl.sum(mine, 0)
        tl.atomic_add(ACC + C_FETCHED, total)
        tl.atomic_add(ACC + C_PREFETCHED, total)
        tl.atomic_add(ACC + C_WASTE, total)


def _units(pool: torch.Tensor) -> torch.Tensor:
    assert pool.dim() == 4 and pool.shape[1] == 2 and pool.is_contiguous(), pool.shape
    return pool


def gather_pages(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_units: torch.Tensor,
    dst_units: torch.Tensor,
    launch: GatherLaunch | None = None,
    stage: Stage | None = None,
    count: torch.Tensor | None = None,
) -> None:
    """dst[dst_units[i]] = src[src_units[i]] for every i with dst_units[i] >= 0 (entries of
    -1 are skipped: a fixed-size list that needs no host round trip). `count` (a device
    integer scalar, optional): no entry from index `count` on is live, so the kernel walks
    only the first `count` (a list compacted on the device: a decode step's 1,312 entries
    held ~28 live ones, and walking them all took half the gather's 16 us per layer on
    the H200). src [U, 2, P, D] may be pinned host memory (read through UVA) when dst is
    on the GPU; indices are int32 on dst's device. `launch`: the programs (by default
    GATHER_PROGRAMS, 16) and the units per program and round trip (None: as many as make
    16K elements, 4 units of 8 KB). Each program waits for one round trip at a time, so the
    bandwidth follows the bytes in flight, programs x rows x unit bytes. (The kernel before `rows` moved 2 KB per round
    trip: 33.7 / 49.6 GB/s with 32 / 66 programs for 4 KB pages against a 55.4 GB/s
    cudaMemcpy ceiling, H200, docs/benchmarks.md.)

    `stage` (rows [R, 2, P, D] on dst's device, row_of [U] int32): units that a prefetch
    has already copied to the device (row_of[unit] = its row, NOT_STAGED otherwise) are
    copied from there instead of the host."""
    launch = launch or GatherLaunch()
    max_programs, rows, use_triton = launch.programs, launch.rows, launch.use_triton
    src, dst, stage = _as_bits(src, dst, stage)
    _units(src), _units(dst)
    assert src.shape[1:] == dst.shape[1:] and src.dtype == dst.dtype
    assert src_units.shape == dst_units.shape and src_units.dtype == torch.int32
    n = src_units.numel()
    if n == 0:
        return
    on_gpu = dst.is_cuda
    if not (HAS_TRITON and (use_triton if use_triton is not None else on_gpu)):
        gather_reference(src, dst, src_units, dst_units, stage)
        return
    if on_gpu and not src.is_cuda:
        src_arg = host_pointer(src)
    else:
        assert INTERPRET or src.device == dst.device
        src_arg = src
    E = src[0].numel()
    EB = triton.next_power_of_2(E)
    if rows is None:
        rows = max(1, GATHER_ELEMENTS // EB)
    rows = triton.next_power_of_2(rows)
    nprog = max(1, min(max_programs, triton.cdiv(n, rows)))
    has = stage is not None
    _gather_kernel[(nprog,)](
        src_arg, dst, src_units, dst_units, stage.rows if has else dst,
        stage.row_of if has else dst_units, count if count is not None else dst_units, n, E=E,
        EB=EB, ROWS=rows, NPROG=nprog, HAS_STAGE=has, NONE=NOT_STAGED,
        HAS_COUNT=count is not None, num_warps=8 if rows * EB >= 8192 else 4,
    )  # fmt: skip


def _as_bits(src, dst, stage):
    """fp8 pools move as their bytes (torch has no CPU index_copy_ for fp8; the kernels
    copy bits either way)."""
    if src.dtype != FP8:
        return src, dst, stage
    rows = Stage(stage.rows.view(torch.uint8), stage.row_of) if stage is not None else None
    return src.view(torch.uint8), dst.view(torch.uint8), rows


def gather_reference(
    src: torch.Tensor, dst: torch.Tensor, src_units: torch.Tensor, dst_units: torch.Tensor,
    stage: Stage | None = None,
) -> None:  # fmt: skip
    keep = dst_units >= 0
    src_units, dst_units = src_units[keep], dst_units[keep]
    rows = src.index_select(0, src_units.to(src.device).long()).to(dst.device)
    if stage is not None:
        r = stage.row_of[src_units.to(stage.row_of.device).long()].long()
        staged = r != NOT_STAGED
        rows = torch.where(staged[:, None, None, None],
                           stage.rows[torch.where(staged, r, 0)], rows)  # fmt: skip
    dst.index_copy_(0, dst_units.to(dst.device).long(), rows)


def gather_copy_engine(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_units: torch.Tensor,
    dst_units: torch.Tensor,
    staging: torch.Tensor | None = None,
) -> None:
    """The copy-engine path: gather on the host into pinned `staging` (at least as many
    units), one asynchronous host-to-device copy, then a scatter into the slots."""
    n = src_units.numel()
    if n == 0:
        return
    if staging is None:
        staging = torch.empty((n, *src.shape[1:]), dtype=src.dtype, pin_memory=dst.is_cuda)
    buf = staging[:n]
    torch.index_select(src, 0, src_units.cpu().long(), out=buf)
    dev = buf.to(dst.device, non_blocking=True)
    dst.index_copy_(0, dst_units.to(dst.device).long(), dev)


def stage_pages(
    src: torch.Tensor, stage: Stage, chosen: Selected, table: PageTable, resident: Resident,
    rows_written: int, counters: Counters, launch: GatherLaunch | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """A prefetch's staging in one kernel: for a predicted selection (chosen.pages
    [B, Hkv, W] columns of table.block_tables [B, M], chosen.counts [B, Hkv]), copy each
    listed unit (page id * Hkv + head) that is not resident (resident.slot_of[unit] < 0)
    and not on a page that this step's last `rows_written` rows of the sequence
    (table.kv_lens [B]) go to, once, from the host pool `src` into stage.rows at its
    listing's row, and record it in stage.row_of (NOT_STAGED before). Adds the number staged
    to counters.acc[c] for each index c of counters.at. Returns (at [N] int64: the entry's
    unit where it wanted one, else the scratch unit, for clearing row_of; page ids
    [B, Hkv, W] int32, -1 past counts). `launch.rows` is not used (the kernel's own)."""
    pages, counts = chosen.pages, chosen.counts
    src, _, stage = _as_bits(src, stage.rows, stage)
    B, Hkv, W = pages.shape
    n = pages.numel()
    dev = stage.rows.device
    on_gpu = stage.rows.is_cuda
    launch = launch or GatherLaunch()
    use_triton = launch.use_triton
    if not (HAS_TRITON and (use_triton if use_triton is not None else on_gpu)):
        return stage_pages_reference(src, stage, chosen, table, resident, rows_written, counters)
    src_arg = host_pointer(src) if on_gpu and not src.is_cuda else src
    at = torch.empty(n, dtype=torch.long, device=dev)
    ids = torch.empty(B, Hkv, W, dtype=torch.int32, device=dev)
    E = src[0].numel()
    EB = triton.next_power_of_2(E)
    rows = max(1, GATHER_ELEMENTS // EB)
    nprog = max(1, min(launch.programs, triton.cdiv(n, rows)))
    tables, lens = table.block_tables, table.kv_lens
    _stage_kernel[(nprog,)](
        src_arg, stage.rows, pages.contiguous(), counts.contiguous(), tables.contiguous(),
        lens.contiguous(), resident.slot_of, stage.row_of, at, ids, counters.acc, n,
        tables.shape[1], rows_written, resident.scratch_unit, *counters.at, HKV=Hkv, W=W,
        P=stage.rows.shape[2], E=E, EB=EB, ROWS=rows, NPROG=nprog, NONE=NOT_STAGED,
        num_warps=8 if rows * EB >= 8192 else 4,
    )  # fmt: skip
    return at, ids


def stage_pages_reference(src: torch.Tensor, stage: Stage, chosen: Selected, table: PageTable,
                          resident: Resident, rows_written: int,
                          counters: Counters) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """stage_pages in torch (each wanted unit staged at its first listing's row)."""
    pages, counts = chosen.pages, chosen.counts
    tables, lens = table.block_tables, table.kv_lens
    slot_of, scratch_unit, acc = resident.slot_of, resident.scratch_unit, counters.acc
    stage_of = stage.row_of
    B, Hkv, W = pages.shape
    dev = stage.rows.device
    ids = torch.gather(tables.long(), 1, pages.reshape(B, -1).long()).view(B, Hkv, W)
    valid = torch.arange(W, device=dev)[None, None, :] < counts[..., None]
    units = (ids * Hkv + torch.arange(Hkv, device=dev)[None, :, None]).reshape(-1)
    written = pages >= ((lens.long() - rows_written) // stage.rows.shape[2])[:, None, None]
    want = (valid & ~written).reshape(-1)
    want &= slot_of[torch.where(want, units, scratch_unit)] < 0
    at = torch.where(want, units, scratch_unit)
    idx = torch.arange(at.numel(), device=dev, dtype=torch.int32)
    stage_of.scatter_reduce_(0, at, torch.where(want, idx, NOT_STAGED), "amin")
    first = want & (stage_of[at] == idx)
    gather_pages(src, stage.rows, torch.where(first, units, 0).to(torch.int32),
                 torch.where(first, idx, -1), GatherLaunch(use_triton=False))  # fmt: skip
    n = first.sum()
    for c in counters.at:
        acc[c] += n
    return at, torch.where(valid, ids, -1).to(torch.int32)
