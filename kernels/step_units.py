"""The units a sparse decode step reads, from its selection, in one kernel.

A selection lists pages per (sequence, KV head): pages [B, Hkv, W] (their index in the
sequence), the first counts [B, Hkv] of them live. The tiered cache reads units (unit =
page id * Hkv + head, the page id from the sequence's block table) and counts what the step
selected. In torch that is ~13 small kernels a layer (casts, a gather, an arange, a
multiply and an add for the units, an arange and a compare for the mask, a sum and four
counter updates): on the H200 each costs a few microseconds in a CUDA graph, ~1 ms a 128K
step over 32 layers (the "other small kernels" of docs/benchmarks.md's decode-step
profile). Here: one program per (sequence, head) writes its row, and program 0 adds the
step's counts to the counters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import HAS_TRITON


@dataclass(frozen=True, slots=True)
class SelectedCounters:
    """Where a step's selection is counted: acc int64, and the indices of the units selected,
    the most selected in one layer-step, and the layer-steps."""

    acc: torch.Tensor
    selected: int
    max_selected: int
    steps: int


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _units_kernel(
        BT, PAGES, COUNTS, UNITS, VALID, ACC, s_bt, W, M, ROWS, C_SEL, C_MAX, C_STEPS,
        HKV: tl.constexpr, BLOCK_W: tl.constexpr, ROWS_P2: tl.constexpr, COUNT: tl.constexpr,
    ):  # fmt: skip
        r = tl.program_id(0)  # (sequence, head) = b * HKV + h
        b = r // HKV
        h = r % HKV
        live = tl.load(COUNTS + r)
        for w0 in range(0, W, BLOCK_W):
            w = w0 + tl.arange(0, BLOCK_W)
            m = w < W
            p = tl.load(PAGES + r * W + w, mask=m, other=0).to(tl.int64)
            ok = m & (p >= 0) & (p < M)
            page = tl.load(BT + b * s_bt + p, mask=ok, other=0).to(tl.int64)
            tl.store(UNITS + r * W + w, page * HKV + h, mask=m)
            tl.store(VALID + r * W + w, (w < live).to(tl.int8), mask=m)
        if COUNT:  # noqa: SIM102 (a constexpr, then a run-time test: Triton keeps them apart)
            if r == 0:
                rows = tl.arange(0, ROWS_P2)
                n = tl.sum(tl.load(COUNTS + rows, mask=rows < ROWS, other=0).to(tl.int64), 0)
                tl.store(ACC + C_SEL, tl.load(ACC + C_SEL) + n)
                tl.store(ACC + C_MAX, tl.maximum(tl.load(ACC + C_MAX), n))
                tl.store(ACC + C_STEPS, tl.load(ACC + C_STEPS) + 1)


def step_units_reference(block_tables: torch.Tensor, pages: torch.Tensor, counts: torch.Tensor,
                         kv_heads: int, counters: SelectedCounters | None = None):  # fmt: skip
    """units [B * Hkv * W] int64 and valid [B * Hkv * W] bool of a selection (pages
    [B, Hkv, W], counts [B, Hkv]) over block_tables [B, M]; the counters updated."""
    B, Hkv, W = pages.shape
    page_ids = torch.gather(block_tables.long(), 1, pages.reshape(B, -1).long())
    heads = torch.arange(Hkv, device=pages.device)[None, :, None]
    units = page_ids.view(B, Hkv, W) * kv_heads + heads
    valid = torch.arange(W, device=pages.device)[None, None, :] < counts[..., None]
    if counters is not None:
        n = counts.sum()
        acc = counters.acc
        acc[counters.selected] += n
        acc[counters.max_selected] = torch.maximum(acc[counters.max_selected], n)
        acc[counters.steps] += 1
    return units.reshape(-1), valid.reshape(-1)


def step_units(block_tables: torch.Tensor, pages: torch.Tensor, counts: torch.Tensor,
               kv_heads: int, counters: SelectedCounters | None = None,
               use_triton: bool | None = None):  # fmt: skip
    """step_units_reference in one kernel (Triton on CUDA tensors, or forced in the
    interpreter by use_triton=True)."""
    if not (HAS_TRITON and (use_triton if use_triton is not None else pages.is_cuda)):
        return step_units_reference(block_tables, pages, counts, kv_heads, counters)
    B, Hkv, W = pages.shape
    assert Hkv == kv_heads and counts.shape == (B, Hkv) and block_tables.stride(1) == 1
    dev = pages.device
    units = torch.empty(B * Hkv * W, dtype=torch.long, device=dev)
    valid = torch.empty(B * Hkv * W, dtype=torch.int8, device=dev)
    acc = counters.acc if counters is not None else units  # (unused without counters)
    where = (counters.selected, counters.max_selected, counters.steps) if counters else (0, 0, 0)
    _units_kernel[(B * Hkv,)](
        block_tables, pages.contiguous(), counts.contiguous(), units, valid, acc,
        block_tables.stride(0), W, block_tables.shape[1], B * Hkv, *where,
        HKV=Hkv, BLOCK_W=min(1024, triton.next_power_of_2(max(W, 1))),
        ROWS_P2=triton.next_power_of_2(B * Hkv), COUNT=counters is not None,
    )  # fmt: skip
    return units, valid.view(torch.bool)
