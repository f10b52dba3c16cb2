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

NOT_STAGED = 2**31 - 1  # a stage table's entry for a unit that no prefetch staged
GATHER_ELEMENTS = 16384  # elements per program and round trip by default (32 KB of bf16)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _gather_kernel(
        SRC, DST, SRC_IDX, DST_IDX, STAGE, STAGE_OF, n,
        E: tl.constexpr, EB: tl.constexpr, ROWS: tl.constexpr, NPROG: tl.constexpr,
        HAS_STAGE: tl.constexpr, NONE: tl.constexpr,
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


def _units(pool: torch.Tensor) -> torch.Tensor:
    assert pool.dim() == 4 and pool.shape[1] == 2 and pool.is_contiguous(), pool.shape
    return pool


def gather_pages(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_units: torch.Tensor,
    dst_units: torch.Tensor,
    max_programs: int | None = None,
    rows: int | None = None,
    use_triton: bool | None = None,
    stage: torch.Tensor | None = None,
    stage_of: torch.Tensor | None = None,
) -> None:
    """dst[dst_units[i]] = src[src_units[i]] for every i with dst_units[i] >= 0 (entries of
    -1 are skipped: a fixed-size list that needs no host round trip). src [U, 2, P, D] may be
    pinned host memory (read through UVA) when dst is on the GPU; indices are int32 on dst's
    device. `max_programs`: None takes half the GPU's SMs (66 on an H200); `rows`: units per
    program and round trip (None: as many as make 16K elements, 4 units of 8 KB). Each
    program waits for one round trip at a time, so the bandwidth follows the bytes in
    flight, programs x rows x unit bytes. (The kernel before `rows` moved 2 KB per round
    trip: 33.7 / 49.6 GB/s with 32 / 66 programs for 4 KB pages against a 55.4 GB/s
    cudaMemcpy ceiling, H200, docs/benchmarks.md.)

    `stage` [R, 2, P, D] on dst's device and `stage_of` [U] int32: units that a prefetch
    has already copied to the device (stage_of[unit] = its row, NOT_STAGED otherwise) are
    copied from there instead of the host."""
    _units(src), _units(dst)
    assert src.shape[1:] == dst.shape[1:] and src.dtype == dst.dtype
    assert src_units.shape == dst_units.shape and src_units.dtype == torch.int32
    n = src_units.numel()
    if n == 0:
        return
    on_gpu = dst.is_cuda
    if not (HAS_TRITON and (use_triton if use_triton is not None else on_gpu)):
        gather_reference(src, dst, src_units, dst_units, stage, stage_of)
        return
    if on_gpu and not src.is_cuda:
        src_arg = host_pointer(src)
    else:
        assert INTERPRET or src.device == dst.device
        src_arg = src
    E = src[0].numel()
    if max_programs is None:
        max_programs = _half_the_sms(dst.device) if on_gpu else 32
    EB = triton.next_power_of_2(E)
    if rows is None:
        rows = max(1, GATHER_ELEMENTS // EB)
    rows = triton.next_power_of_2(rows)
    nprog = max(1, min(max_programs, triton.cdiv(n, rows)))
    has = stage is not None
    _gather_kernel[(nprog,)](
        src_arg, dst, src_units, dst_units, stage if has else dst,
        stage_of if has else dst_units, n, E=E, EB=EB, ROWS=rows, NPROG=nprog,
        HAS_STAGE=has, NONE=NOT_STAGED, num_warps=8 if rows * EB >= 8192 else 4,
    )  # fmt: skip


_SMS: dict = {}


def _half_the_sms(device: torch.device) -> int:
    if device not in _SMS:
        _SMS[device] = max(1, torch.cuda.get_device_properties(device).multi_processor_count // 2)
    return _SMS[device]


def gather_reference(
    src: torch.Tensor, dst: torch.Tensor, src_units: torch.Tensor, dst_units: torch.Tensor,
    stage: torch.Tensor | None = None, stage_of: torch.Tensor | None = None,
) -> None:  # fmt: skip
    keep = dst_units >= 0
    src_units, dst_units = src_units[keep], dst_units[keep]
    rows = src.index_select(0, src_units.to(src.device).long()).to(dst.device)
    if stage is not None:
        r = stage_of[src_units.to(stage_of.device).long()].long()
        staged = r != NOT_STAGED
        rows = torch.where(staged[:, None, None, None],
                           stage[torch.where(staged, r, 0)], rows)  # fmt: skip
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
