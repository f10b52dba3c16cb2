"""Rotary embedding of q and k, fused with the KV append into the paged cache.

    q' = q * cos + rotate_half(q) * sin            -> returned, [T, Hq, D]
    k' = k * cos + rotate_half(k) * sin, v         -> kv[page, head, 0|1, offset]

Rounded like the eager model (each product, then the sum, in the activation dtype); an fp8
pool stores k' and v rounded to fp8 (kernels.fp8), the returned k' stays unrounded.
Eager this is ~14 kernels per layer (cat, neg, mul, add, two index_put); here it is one.
"""

from __future__ import annotations

import torch

from kernels import HAS_TRITON, host_pointer
from kernels.fp8 import FP8, kv_store_view, to_kv
from kernels.views import RowPlaces

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.fp8 import _fp8_bits

    @triton.jit
    def _rotate(x_ptr, cos, sin, d, D: tl.constexpr):
        half: tl.constexpr = D // 2
        x = tl.load(x_ptr + d)
        partner = tl.load(x_ptr + (d + half) % D)
        rot = tl.where(d < half, -partner.to(tl.float32), partner.to(tl.float32))
        a = (x.to(tl.float32) * cos).to(x.dtype).to(tl.float32)
        b = (rot * sin).to(x.dtype).to(tl.float32)
        return (a + b).to(x.dtype)

    @triton.jit
    def _rope_kv_kernel(
        Q, K, V, COS, SIN, PAGES, OFFS, KV, QOUT, KOUT,
        s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ct, s_ot, s_oh, s_kot, s_koh,
        s_kvp, s_kvh, s_kvkv, s_kvt,
        HQ: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr,
    ):  # fmt: skip
        t = tl.program_id(0)
        h = tl.program_id(1)
        d = tl.arange(0, D)
        cos = tl.load(COS + t * s_ct + d).to(tl.float32)
        sin = tl.load(SIN + t * s_ct + d).to(tl.float32)
        if h < HQ:
            q = _rotate(Q + t * s_qt + h * s_qh, cos, sin, d, D)
            tl.store(QOUT + t * s_ot + h * s_oh + d, q)
        else:
            j = h - HQ
            page = tl.load(PAGES + t).to(tl.int64)
            off = tl.load(OFFS + t)
            dst = KV + page * s_kvp + j * s_kvh + off * s_kvt + d
            k = _rotate(K + t * s_kt + j * s_kh, cos, sin, d, D)
            v = tl.load(V + t * s_vt + j * s_vh + d)
            tl.store(KOUT + t * s_kot + j * s_koh + d, k)
            if FP8:  # (KV: the pool's uint8 bits)
                tl.store(dst, _fp8_bits(k))
                tl.store(dst + s_kvkv, _fp8_bits(v))
            else:
                tl.store(dst, k)
                tl.store(dst + s_kvkv, v)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] by the angles of its T positions (cos/sin [T, D]), rotate-half
    layout."""
    half = x.shape[-1] // 2
    return x * cos[:, None] + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin[:, None]


def rope_kv_reference(q, k, v, cos, sin, kv, at: RowPlaces):
    """q: [T, Hq, D], k, v: [T, Hkv, D], cos/sin: [T, D], kv: [N, Hkv, 2, P, D]; the rows
    go to `at` (pages, offsets [T])."""
    slot_pages, slot_offsets = at.pages, at.offsets
    hq = q.shape[1]
    x = apply_rope(torch.cat((q, k), dim=1), cos, sin)  # q and k together: half the CPU ops
    q, k = x[:, :hq], x[:, hq:]
    kv[slot_pages, :, 0, slot_offsets] = to_kv(k, kv.dtype)
    kv[slot_pages, :, 1, slot_offsets] = to_kv(v, kv.dtype)
    return q, k


def rope_kv(q, k, v, cos, sin, kv, at: RowPlaces, use_triton: bool | None = None):
    """Returns the rotated (q [T, Hq, D], k [T, Hkv, D]); writes rotated k and v into kv at
    `at`."""
    if not (HAS_TRITON and (use_triton if use_triton is not None else q.is_cuda)):
        return rope_kv_reference(q, k, v, cos, sin, kv, at)
    slot_pages, slot_offsets = at.pages, at.offsets
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    assert k.shape == v.shape == (T, Hkv, D) and kv.shape[1] == Hkv and kv.shape[-1] == D
    assert cos.shape == sin.shape == (T, D) and cos.stride() == sin.stride()
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == kv.stride(-1) == 1
    out = torch.empty(T, Hq, D, device=q.device, dtype=q.dtype)
    k_out = torch.empty(T, Hkv, D, device=q.device, dtype=q.dtype)
    kv_arg = kv_store_view(kv)
    if q.is_cuda and not kv.is_cuda:  # the host tier: pinned memory, written through UVA
        kv_arg = host_pointer(kv_arg)
    _rope_kv_kernel[(T, Hq + Hkv)](
        q, k, v, cos, sin, slot_pages, slot_offsets, kv_arg, out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), out.stride(0), out.stride(1), k_out.stride(0), k_out.stride(1),
        kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3),
        HQ=Hq, D=D, FP8=kv.dtype == FP8,
    )  # fmt: skip
    return out, k_out
