"""KV append for the tiered cache: each new K/V row goes to the host tier (write-through),
to its GPU slot when the page has one, and into its page's key summary.

Inputs, for one layer:
- k, v [N, Hkv, D]: the step's rows (RoPE applied), N tokens of any sequences;
- host [U, 2, P, D]: the host pool's units (unit = page * Hkv + head); on a GPU run it is
  pinned host memory, written through unified virtual addressing;
- gpu [S, 2, P, D]: the GPU slot pool;
- pages [N] int32: each row's page id; offsets [N] int32: its row in the page;
- slots [N, Hkv] int32: the GPU slot of (row's page, head), or -1 if it has none;
- summ [U, 3, D] fp32: min, max and sum of each unit's keys (see kernels.page_score).
  A page's summary must be reset before its first row is appended; rows of one page from
  the same call are merged with atomics.

Grid: (N, Hkv), one program per (row, head).
"""

from __future__ import annotations

import torch

from kernels import HAS_TRITON, INTERPRET, host_pointer
from kernels.fp8 import FP8, kv_store_view, to_kv
from kernels.views import RowPlaces, SlotTable

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.fp8 import _fp8_bits

    @triton.jit
    def _append_kernel(
        K, V, HOST, GPU, PAGES, OFFS, SLOTS, SUMM,
        s_kn, s_kh, s_vn, s_vh,
        s_un, s_ukv, s_ut,
        s_gn, s_gkv, s_gt,
        s_sn, s_sh, s_ssn, s_ssr,
        HKV: tl.constexpr, D: tl.constexpr, HAS_GPU: tl.constexpr,
    ):  # fmt: skip
        i = tl.program_id(0)
        h = tl.program_id(1)
        d = tl.arange(0, D)
        k = tl.load(K + i * s_kn + h * s_kh + d)
        v = tl.load(V + i * s_vn + h * s_vh + d)
        page = tl.load(PAGES + i).to(tl.int64)
        off = tl.load(OFFS + i)
        unit = page * HKV + h
        row = HOST + unit * s_un + off * s_ut + d
        tl.store(row, k)
        tl.store(row + s_ukv, v)
        if HAS_GPU:
            slot = tl.load(SLOTS + i * s_sn + h * s_sh)
            if slot >= 0:
                g = GPU + slot.to(tl.int64) * s_gn + off * s_gt + d
                tl.store(g, k)
                tl.store(g + s_gkv, v)
        kf = k.to(tl.float32)
        s = SUMM + unit * s_ssn + d
        tl.atomic_min(s, kf)
        tl.atomic_max(s + s_ssr, kf)
        tl.atomic_add(s + 2 * s_ssr, kf)


def append_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    host: torch.Tensor,
    gpu: torch.Tensor | None,
    at: RowPlaces,
    slots: torch.Tensor | None,
    summ: torch.Tensor,
    use_triton: bool | None = None,
) -> None:
    """Write rows k/v into the host pool at their places, their GPU slots and the key
    summaries."""
    pages, offsets = at.pages, at.offsets
    N, Hkv, D = k.shape
    assert v.shape == k.shape and host.shape[1:] == (2, host.shape[2], D)
    assert pages.shape == offsets.shape == (N,) and summ.shape[1:] == (3, D)
    assert pages.dtype == offsets.dtype == torch.int32 and summ.dtype == torch.float32
    if slots is not None:
        assert slots.shape == (N, Hkv) and slots.dtype == torch.int32 and gpu is not None
    assert host.dtype != FP8, "append_kv writes no fp8 rows (the engine's is tier_append)"
    if N == 0:
        return
    if not (HAS_TRITON and (use_triton if use_triton is not None else k.is_cuda)):
        append_kv_reference(k, v, host, gpu, at, slots, summ)
        return
    host_arg = host
    if k.is_cuda and not host.is_cuda:
        host_arg = host_pointer(host)
    else:
        assert INTERPRET or host.device == k.device
    has_gpu = slots is not None
    g = gpu if has_gpu else host_arg
    sl = slots if has_gpu else pages
    _append_kernel[(N, Hkv)](
        k, v, host_arg, g, pages, offsets, sl, summ,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        host.stride(0), host.stride(1), host.stride(2),
        *(gpu.stride()[:3] if has_gpu else (0, 0, 0)),
        *(slots.stride() if has_gpu else (0, 0)),
        summ.stride(0), summ.stride(1),
        HKV=Hkv, D=D, HAS_GPU=has_gpu,
    )  # fmt: skip


def append_kv_reference(k, v, host, gpu, at: RowPlaces, slots, summ) -> None:
    pages, offsets = at.pages, at.offsets
    N, Hkv, D = k.shape
    dev = host.device
    units = (pages.long()[:, None] * Hkv + torch.arange(Hkv, device=pages.device)).to(dev)
    offs = offsets.long().to(dev)[:, None].expand(N, Hkv)
    host[units, 0, offs] = k.to(dev, host.dtype)
    host[units, 1, offs] = v.to(dev, host.dtype)
    if slots is not None:
        has = slots >= 0
        s = slots[has].long()
        o = offsets.long()[:, None].expand(N, Hkv)[has]
        gpu[s, 0, o] = k[has].to(gpu.dtype)
        gpu[s, 1, o] = v[has].to(gpu.dtype)
    kf = k.float().to(summ.device).reshape(N * Hkv, D)
    u = units.reshape(-1).to(summ.device)
    idx = u[:, None].expand(-1, D)
    summ[:, 0].scatter_reduce_(0, idx, kf, "amin")
    summ[:, 1].scatter_reduce_(0, idx, kf, "amax")
    summ[:, 2].index_add_(0, u, kf)


# -- the tiered cache's append (engine.kv.TieredKV.after_append) ------------------------------
#
# The engine's own layout: the rows are already in the host tier (the model's RoPE kernel
# wrote them there); what remains is the GPU slot of each (row's page, head), if it has one,
# and the page's key summary in the `summary_rows` layout (Quest min/max in the keys' dtype,
# or the fp32 sum, or all three), where a row at offset 0 starts its page's summary again.
# One program per (row, head), no atomics: the rows of one call must fold into distinct
# units (a decode step: each sequence appends one row to its own last page) or not fold at
# all (a verification's rows, folded once accepted). ~15 torch kernels per layer become one.

if HAS_TRITON:

    @triton.jit
    def _tier_append_kernel(
        K, V, SLOTS, SLOT_OF, SUMM, PAGES, OFFS,
        s_kn, s_kh, s_vn, s_vh, s_sn, s_skv, s_st, s_un, s_ur,
        HKV: tl.constexpr, D: tl.constexpr, FOLD: tl.constexpr,
        ROW_MIN: tl.constexpr, ROW_MAX: tl.constexpr, ROW_SUM: tl.constexpr, FP8: tl.constexpr,
        SUMM_FP8: tl.constexpr,
    ):  # fmt: skip
        i = tl.program_id(0)
        h = tl.program_id(1)
        d = tl.arange(0, D)
        k = tl.load(K + i * s_kn + h * s_kh + d)
        v = tl.load(V + i * s_vn + h * s_vh + d)
        unit = tl.load(PAGES + i).to(tl.int64) * HKV + h
        off = tl.load(OFFS + i).to(tl.int64)
        slot = tl.load(SLOT_OF + unit).to(tl.int64)
        if FP8:  # the rows as the tiers hold them: k is folded rounded too
            k8 = _fp8_bits(k)
            k = k8.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        if slot >= 0:
            row = SLOTS + slot * s_sn + off * s_st + d
            if FP8:  # (SLOTS: the slots' uint8 bits)
                tl.store(row, k8)
                tl.store(row + s_skv, _fp8_bits(v))
            else:
                tl.store(row, k.to(SLOTS.dtype.element_ty))
                tl.store(row + s_skv, v.to(SLOTS.dtype.element_ty))
        if FOLD:
            fresh = off == 0
            s = SUMM + unit * s_un + d
            if ROW_MIN >= 0:
                # compared in fp32 (exact: the result is one of the two values, stored back in
                # the summaries' dtype; the interpreter's bf16 comparisons are wrong)
                if SUMM_FP8:  # (SUMM: uint8 bits; k is already an fp8 value: FP8 holds)
                    kq = k
                    mn = tl.load(s + ROW_MIN * s_ur).to(tl.float8e4nv, bitcast=True)
                    mx = tl.load(s + ROW_MAX * s_ur).to(tl.float8e4nv, bitcast=True)
                    mn, mx = mn.to(tl.float32), mx.to(tl.float32)
                else:
                    kq = k.to(SUMM.dtype.element_ty).to(tl.float32)
                    mn = tl.load(s + ROW_MIN * s_ur).to(tl.float32)
                    mx = tl.load(s + ROW_MAX * s_ur).to(tl.float32)
                mn = tl.where(fresh, kq, tl.minimum(mn, kq))
                mx = tl.where(fresh, kq, tl.maximum(mx, kq))
                if SUMM_FP8:
                    tl.store(s + ROW_MIN * s_ur, _fp8_bits(mn))
                    tl.store(s + ROW_MAX * s_ur, _fp8_bits(mx))
                else:
                    tl.store(s + ROW_MIN * s_ur, mn.to(SUMM.dtype.element_ty))
                    tl.store(s + ROW_MAX * s_ur, mx.to(SUMM.dtype.element_ty))
            if ROW_SUM >= 0:
                acc = tl.load(s + ROW_SUM * s_ur).to(tl.float32)
                acc = tl.where(fresh, 0.0, acc) + k.to(tl.float32)
                tl.store(s + ROW_SUM * s_ur, acc)


def tier_append(
    k: torch.Tensor,
    v: torch.Tensor,
    tier: SlotTable,
    summ: torch.Tensor,
    at: RowPlaces,
    rows: dict[str, int],
    fold: bool,
    use_triton: bool | None = None,
) -> None:
    """One layer: k, v [N, Hkv, D] (rows already in the host tier, at pages, offsets [N])
    into the GPU slots tier.slots [S, 2, P, D] of their units (tier.slot_of [U] int32, -1:
    none) and, with `fold`, into the summaries `summ` [U, R, D] (`rows`:
    kernels.page_score.summary_rows). With `fold`, the N rows must fall in distinct pages
    (see above)."""
    slots, slot_of, pages, offsets = tier.slots, tier.slot_of, at.pages, at.offsets
    N, Hkv, D = k.shape
    assert v.shape == k.shape and pages.shape == offsets.shape == (N,)
    if N == 0:
        return
    if summ.dtype == FP8 and slots.dtype != FP8:
        raise ValueError("fp8 summaries fold fp8 keys only (an fp8 pool's)")
    if not (HAS_TRITON and (use_triton if use_triton is not None else k.is_cuda)):
        tier_append_reference(k, v, tier, summ, at, rows, fold)
        return
    _tier_append_kernel[(N, Hkv)](
        k, v, kv_store_view(slots), slot_of, kv_store_view(summ), pages, offsets,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        slots.stride(0), slots.stride(1), slots.stride(2), summ.stride(0), summ.stride(1),
        HKV=Hkv, D=D, FOLD=fold, ROW_MIN=rows["min"], ROW_MAX=rows["max"], ROW_SUM=rows["sum"],
        FP8=slots.dtype == FP8, SUMM_FP8=summ.dtype == FP8,
    )  # fmt: skip


def tier_append_reference(k, v, tier: SlotTable, summ, at: RowPlaces, rows, fold) -> None:
    """The same in torch ops, for any rows (rows of one page fold with scatter reductions);
    no host round trip (CUDA-graph safe). The last unit of `summ` is scratch."""
    slots, slot_of, pages, offsets = tier.slots, tier.slot_of, at.pages, at.offsets
    N, Hkv, D = k.shape
    dev = slots.device
    heads = torch.arange(Hkv, device=dev)
    units = (pages.to(dev).long()[:, None] * Hkv + heads).reshape(-1)  # [N * Hkv]
    offs = offsets.to(dev).long()[:, None].expand(-1, Hkv).reshape(-1)
    slot = slot_of[units].long()
    dst = torch.where(slot >= 0, slot, slots.shape[0] - 1)  # the last slot is scratch too
    k = to_kv(k.reshape(-1, D).to(dev), slots.dtype)  # (as the tiers hold it: folded so too)
    slots[dst, 0, offs] = k
    slots[dst, 1, offs] = to_kv(v.reshape(-1, D).to(dev), slots.dtype)
    if fold:
        fold_summaries(summ, k, units, offs == 0, summ.shape[0] - 1, rows)


def fold_summaries(summ, k, units, fresh, scratch, rows: dict[str, int]) -> None:
    """Fold keys k [N, D] into summaries summ [U, R, D] at `units` [N]; a `fresh` row (its
    page's first) starts its unit's summary again; `scratch` (an int or [N]): the unit that
    takes the resets of the other rows. No host round trip (CUDA-graph safe)."""
    if summ.dtype == FP8:
        _fold_fp8(summ, k, units, fresh, rows)
        return
    first = torch.where(fresh, units, scratch)
    kf = k.to(summ.device, summ.dtype)
    if rows["min"] >= 0:
        # index_fill_, not item assignment: a Python scalar there is a host-to-device copy,
        # which a CUDA graph cannot hold
        summ[:, rows["min"]].index_fill_(0, first, float("inf"))
        summ[:, rows["max"]].index_fill_(0, first, float("-inf"))
        idx = units[:, None].expand(-1, kf.shape[-1])
        summ[:, rows["min"]].scatter_reduce_(0, idx, kf, "amin")
        summ[:, rows["max"]].scatter_reduce_(0, idx, kf, "amax")
    if rows["sum"] >= 0:
        summ[:, rows["sum"]].index_fill_(0, first, 0.0)
        summ[:, rows["sum"]].index_add_(0, units, kf)


def _fold_fp8(summ, k, units, fresh, rows: dict[str, int]) -> None:
    """fold_summaries into fp8 Quest summaries (torch has no fp8 scatter reductions): each
    touched unit's statistic is folded at the first of its rows (found by a scatter over a
    map of every unit), then written back to all of its rows as bytes. In bf16, which holds
    every fp8 value: exact, as the keys are fp8 values (an fp8 pool's) and a min or max of
    them is one of them. (A prefill chunk's [N, D] at a time: 2 bytes a value, not 4.)"""
    assert rows["sum"] < 0, "sums are kept in fp32"
    dev, N = summ.device, units.numel()
    units = units.to(dev).long()
    order = torch.arange(N, dtype=torch.int32, device=dev)
    first = torch.full((summ.shape[0],), N, dtype=torch.int32, device=dev)
    rep = first.scatter_reduce_(0, units, order, "amin")[units].long()  # its unit's first row
    restart = torch.zeros(N, dtype=torch.int32, device=dev)
    restart = restart.scatter_reduce_(0, rep, fresh.to(dev).int(), "amax").bool()[:, None]
    kf = k.to(dev, torch.bfloat16)
    idx = rep[:, None].expand(-1, kf.shape[-1])
    bits = summ.view(torch.uint8)
    for row, empty, how in ((rows["min"], float("inf"), "amin"),
                            (rows["max"], float("-inf"), "amax")):  # fmt: skip
        acc = torch.where(restart, empty, bits[units, row].view(FP8).to(torch.bfloat16))
        acc.scatter_reduce_(0, idx, kf, how)
        bits[units, row] = acc[rep].to(FP8).view(torch.uint8)
