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

if HAS_TRITON:
    import triton
    import triton.language as tl

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
    pages: torch.Tensor,
    offsets: torch.Tensor,
    slots: torch.Tensor | None,
    summ: torch.Tensor,
    use_triton: bool | None = None,
) -> None:
    """Write rows k/v into the host pool, their GPU slots and the key summaries."""
    N, Hkv, D = k.shape
    assert v.shape == k.shape and host.shape[1:] == (2, host.shape[2], D)
    assert pages.shape == offsets.shape == (N,) and summ.shape[1:] == (3, D)
    assert pages.dtype == offsets.dtype == torch.int32 and summ.dtype == torch.float32
    if slots is not None:
        assert slots.shape == (N, Hkv) and slots.dtype == torch.int32 and gpu is not None
    if N == 0:
        return
    if not (HAS_TRITON and (use_triton if use_triton is not None else k.is_cuda)):
        append_kv_reference(k, v, host, gpu, pages, offsets, slots, summ)
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


def append_kv_reference(k, v, host, gpu, pages, offsets, slots, summ) -> None:
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
