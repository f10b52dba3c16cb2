"""Sparse paged decode attention: each (sequence, KV head) attends only to its own list of
pages, with several query tokens per sequence (one for decode, k+1 for verification).

Three parts: the Triton kernel, its launcher, and the pure-torch reference.

Inputs, for one layer:
- q [B, T, Hq, D]: T query tokens per sequence, the last T positions of its context;
- kv [N, 2, P, D]: page units, one (page, KV head) each, K rows then V rows. The GPU slot
  pool has this shape; a dense pool [pages, Hkv, 2, P, D] is the same memory viewed as
  [pages * Hkv, 2, P, D] (unit = page * Hkv + head);
- units [B, Hkv, M] int32: the units each (sequence, KV head) reads, M padded;
- pages [B, Hkv, M] int32: their page numbers in the sequence (token positions page * P + i);
- counts [B, Hkv] int32: how many entries of units/pages are valid;
- kv_lens [B] int32: the context length, the T query tokens included. Query t sits at
  position kv_lens - T + t and sees the keys at positions <= its own (causal within the
  last pages), so one page list serves all T queries of a verification.

Grid: (B * Hkv, splits). A program takes every query row of one GQA group (G heads x T
tokens, padded to 16 rows for tl.dot), walks its split of the page list BLOCK_PAGES pages at
a time with an online softmax in fp32, and writes partial (acc, max, sum). A combine kernel
merges the splits. Split ranges follow `counts` inside the kernel, so the grid is static for
CUDA graphs while the lists vary in length per head and per step.
"""

from __future__ import annotations

import math

import torch

from kernels import HAS_TRITON
from kernels.views import PageList

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _sparse_decode_kernel(
        Q, KV, UNITS, PAGES, COUNTS, LENS, QMASK, ACC, M, L,
        scale,
        s_qb, s_qt, s_qh,
        s_kvn, s_kvkv, s_kvt,
        s_ub, s_uh, s_cb,
        s_ab, s_ah, s_as, s_ar,
        s_mb, s_mh, s_ms,
        HKV: tl.constexpr, G: tl.constexpr, T: tl.constexpr, R: tl.constexpr,
        D: tl.constexpr, P: tl.constexpr, BLOCK_PAGES: tl.constexpr,
        NUM_SPLITS: tl.constexpr, IEEE: tl.constexpr, HAS_QMASK: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        s = tl.program_id(1)
        b = bh // HKV
        h = bh % HKV
        count = tl.load(COUNTS + b * s_cb + h)
        length = tl.load(LENS + b)
        n_blocks = tl.cdiv(count, BLOCK_PAGES)
        per_split = tl.cdiv(n_blocks, NUM_SPLITS)
        blk_lo = s * per_split
        blk_hi = tl.minimum(blk_lo + per_split, n_blocks)

        r = tl.arange(0, R)  # query row = t * G + g
        t_of = r // G
        g_of = r % G
        r_mask = r < G * T
        d = tl.arange(0, D)
        q = tl.load(
            Q + b * s_qb + t_of[:, None] * s_qt + (h * G + g_of)[:, None] * s_qh + d[None, :],
            mask=r_mask[:, None],
            other=0.0,
        )
        q_pos = length - T + t_of  # each row's own position

        m_i = tl.full([R], float("-inf"), tl.float32)
        l_i = tl.zeros([R], tl.float32)
        acc = tl.zeros([R, D], tl.float32)
        j = tl.arange(0, BLOCK_PAGES * P)  # key rows of one block: page j // P, row j % P
        for blk in range(blk_lo, blk_hi):
            e = blk * BLOCK_PAGES + j // P  # entry in the page list
            e_mask = e < count
            unit = tl.load(UNITS + b * s_ub + h * s_uh + e, mask=e_mask, other=0)
            page = tl.load(PAGES + b * s_ub + h * s_uh + e, mask=e_mask, other=0)
            k_pos = page * P + j % P
            k_mask = e_mask & (k_pos < length)
            row = KV + unit.to(tl.int64) * s_kvn + (j % P) * s_kvt
            k = tl.load(row[:, None] + d[None, :], mask=k_mask[:, None], other=0.0)
            v = tl.load(row[:, None] + s_kvkv + d[None, :], mask=k_mask[:, None], other=0.0)
            k, v = k.to(q.dtype), v.to(q.dtype)  # (fp8 rows: to the query's dtype)
            if IEEE:  # fp32 inputs: no TF32 rounding, so fp32 results match the reference
                scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                scores = tl.dot(q, tl.trans(k)) * scale  # [R, BLOCK_PAGES * P], fp32
            seen = k_mask[None, :] & (k_pos[None, :] <= q_pos[:, None])
            if HAS_QMASK:  # bit t of an entry: query t selected that page
                bits = tl.load(QMASK + b * s_ub + h * s_uh + e, mask=e_mask, other=0)
                seen = seen & (((bits[None, :] >> t_of[:, None]) & 1) != 0)
            scores = tl.where(seen, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            # rows that have seen nothing yet keep m = -inf: avoid exp(-inf - -inf)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(scores - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        base = b * s_ab + h * s_ah + s * s_as
        tl.store(ACC + base + r[:, None] * s_ar + d[None, :], acc, mask=r_mask[:, None])
        mb = b * s_mb + h * s_mh + s * s_ms
        tl.store(M + mb + r, m_i, mask=r_mask)
        tl.store(L + mb + r, l_i, mask=r_mask)

    @triton.jit
    def _sparse_combine_kernel(
        ACC, M, L, OUT,
        s_ab, s_ah, s_as, s_ar,
        s_mb, s_mh, s_ms,
        s_ob, s_ot, s_oh,
        HKV: tl.constexpr, G: tl.constexpr, NUM_SPLITS: tl.constexpr, SP: tl.constexpr,
        D: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        row = tl.program_id(1)  # t * G + g
        b = bh // HKV
        h = bh % HKV
        s = tl.arange(0, SP)
        d = tl.arange(0, D)
        valid = s < NUM_SPLITS
        mb = b * s_mb + h * s_mh + row
        m = tl.load(M + mb + s * s_ms, mask=valid, other=float("-inf"))
        lsum = tl.load(L + mb + s * s_ms, mask=valid, other=0.0)
        top = tl.max(m, 0)
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - top))  # empty splits weigh 0
        acc = tl.load(
            ACC + b * s_ab + h * s_ah + s[:, None] * s_as + row * s_ar + d[None, :],
            mask=valid[:, None],
            other=0.0,
        )
        out = tl.sum(acc * w[:, None], 0) / tl.sum(lsum * w, 0)
        t = row // G
        g = row % G
        tl.store(OUT + b * s_ob + t * s_ot + (h * G + g) * s_oh + d, out.to(OUT.dtype.element_ty))


def default_num_splits(batch: int, kv_heads: int, max_entries: int, device) -> int:
    """About 4 programs per SM, but no more splits than page blocks to share."""
    sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if torch.device(device).type == "cuda"
        else 4
    )
    want = math.ceil(4 * sms / (batch * kv_heads))
    return max(1, min(64, want, max(1, max_entries // 4)))


def _check(q, kv, units, pages, counts, kv_lens):
    B, T, Hq, D = q.shape
    _, two, P, Dk = kv.shape
    Bu, Hkv, Mx = units.shape
    assert two == 2 and Dk == D, (q.shape, kv.shape)
    assert Bu == B and Hq % Hkv == 0, (q.shape, units.shape)
    assert pages.shape == units.shape and counts.shape == (B, Hkv) and kv_lens.shape == (B,)
    assert q.stride(-1) == 1 and kv.stride(-1) == 1
    assert units.dtype == pages.dtype == counts.dtype == kv_lens.dtype == torch.int32
    return B, T, Hq, D, P, Hkv, Mx


def sparse_decode_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    listed: PageList,
    kv_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    block_pages: int = 4,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Attention of q [B, T, Hq, D] over the listed pages; returns [B, T, Hq, D] in q's
    dtype. See the module docstring for the layout. A row that sees no key returns NaN
    (the caller always lists the query's own page). `listed.qmask` [B, Hkv, M] int32
    (optional): bit t of an entry says whether query t reads that page (the union of
    per-query selections of a verification: one list, one fetch, each query its own
    pages)."""
    units, pages, counts, qmask = listed.units, listed.pages, listed.counts, listed.qmask
    B, T, Hq, D, P, Hkv, Mx = _check(q, kv, units, pages, counts, kv_lens)
    if qmask is not None:
        assert qmask.shape == units.shape and qmask.dtype == torch.int32 and T <= 31
        assert qmask.stride() == units.stride()
    if not (HAS_TRITON and (use_triton if use_triton is not None else q.is_cuda)):
        return sparse_decode_reference(q, kv, listed, kv_lens, scale)
    G = Hq // Hkv
    R = max(16, triton.next_power_of_2(G * T))
    if num_splits is None:
        num_splits = default_num_splits(B, Hkv, Mx, q.device)
    acc = torch.empty(B, Hkv, num_splits, R, D, device=q.device, dtype=torch.float32)
    m = torch.empty(B, Hkv, num_splits, R, device=q.device, dtype=torch.float32)
    lsum = torch.empty_like(m)
    _sparse_decode_kernel[(B * Hkv, num_splits)](
        q, kv, units, pages, counts, kv_lens, units if qmask is None else qmask, acc, m, lsum,
        scale,
        q.stride(0), q.stride(1), q.stride(2),
        kv.stride(0), kv.stride(1), kv.stride(2),
        units.stride(0), units.stride(1), counts.stride(0),
        acc.stride(0), acc.stride(1), acc.stride(2), acc.stride(3),
        m.stride(0), m.stride(1), m.stride(2),
        HKV=Hkv, G=G, T=T, R=R, D=D, P=P, BLOCK_PAGES=block_pages,
        NUM_SPLITS=num_splits, IEEE=q.dtype == torch.float32, HAS_QMASK=qmask is not None,
    )  # fmt: skip
    out = torch.empty_like(q)
    _sparse_combine_kernel[(B * Hkv, G * T)](
        acc, m, lsum, out,
        acc.stride(0), acc.stride(1), acc.stride(2), acc.stride(3),
        m.stride(0), m.stride(1), m.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        HKV=Hkv, G=G, NUM_SPLITS=num_splits, SP=triton.next_power_of_2(num_splits), D=D,
    )  # fmt: skip
    return out


def _reference_one(qh, kv, units, pages, n: int, scale: float) -> torch.Tensor:
    """One (sequence, KV head): queries qh [T, G, D] at the last T of n positions over the
    listed page units; fp32 inside, qh's dtype out."""
    T, _, D = qh.shape
    P = kv.shape[2]
    unit_kv = kv[units.long()].float()  # [c, 2, P, D]
    k = unit_kv[:, 0].reshape(-1, D)
    k_pos = (pages.long()[:, None] * P + torch.arange(P, device=qh.device)[None, :]).reshape(-1)
    # rows past the context may hold anything (a rejected draft, never-written pool memory):
    # zero them, since 0 x NaN in p @ v would still be NaN
    v = torch.where((k_pos < n)[:, None], unit_kv[:, 1].reshape(-1, D), 0.0)
    q_pos = torch.arange(n - T, n, device=qh.device)
    seen = (k_pos[None, :] < n) & (k_pos[None, :] <= q_pos[:, None])  # [T, c*P]
    scores = torch.einsum("tgd,kd->tgk", qh.float(), k) * scale
    scores = scores.masked_fill(~seen[:, None, :], float("-inf"))
    return (torch.softmax(scores, -1) @ v).to(qh.dtype)


def sparse_decode_reference(
    q: torch.Tensor, kv: torch.Tensor, listed: PageList, kv_lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """Pure torch, fp32: gather each (sequence, head)'s listed pages, mask by position (and
    by `qmask`'s bits: query t reads the entries whose bit t is set)."""
    units, pages, counts, qmask = listed.units, listed.pages, listed.counts, listed.qmask
    B, T, Hq, D, P, Hkv, _ = _check(q, kv, units, pages, counts, kv_lens)
    G = Hq // Hkv
    out = torch.empty_like(q)
    for b in range(B):
        n = int(kv_lens[b])
        for h in range(Hkv):
            c = int(counts[b, h])
            heads = slice(h * G, (h + 1) * G)
            if qmask is None:
                out[b, :, heads] = _reference_one(q[b, :, heads], kv, units[b, h, :c],
                                                  pages[b, h, :c], n, scale)  # fmt: skip
                continue
            # each query alone over exactly its own pages, as a one-token step at its
            # position computes it (same list, same length, same arithmetic)
            for t in range(T):
                mine = ((qmask[b, h, :c].long() >> t) & 1).bool()
                out[b, t : t + 1, heads] = _reference_one(
                    q[b, t : t + 1, heads], kv, units[b, h, :c][mine], pages[b, h, :c][mine],
                    n - T + 1 + t, scale,
                )  # fmt: skip
    return out
