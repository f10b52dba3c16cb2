"""Page scoring for sparse attention, and top-k page selection.

Every page of every (sequence, KV head) has a summary of its keys, kept on the GPU:
`summ [N, 3, D]` fp32 per layer, with the unit layout of the KV pools (unit = page * Hkv +
head): row 0 the elementwise min of the page's keys, row 1 the max, row 2 their sum.

A page's score for one query row q:
- "quest": sum_d max(q_d * kmin_d, q_d * kmax_d), an upper bound on q.k over the page
  (Quest);
- "mean": q . (ksum / n), the dot product with the page's mean key.
Rows are pooled per (sequence, KV head): summed over the query heads of the GQA group,
then the max over the T query tokens (a verification's queries share one selection).

`page_scores` runs the Triton kernel (grid: (B * Hkv, page blocks)); `select_pages` turns
scores into page lists (sinks, local window, top-k, optional stochastic tail).
"""

from __future__ import annotations

import torch

from kernels import HAS_TRITON

MODES = {"quest": 0, "mean": 1}

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _page_score_kernel(
        Q, SUMM, BT, LENS, OUT,
        s_qb, s_qt, s_qh,
        s_sn, s_sr,
        s_btb, s_ob, s_oh,
        HKV: tl.constexpr, G: tl.constexpr, T: tl.constexpr, R: tl.constexpr,
        D: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr,
        IEEE: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        blk = tl.program_id(1)
        b = bh // HKV
        h = bh % HKV
        length = tl.load(LENS + b)
        n_pages = tl.cdiv(length, P)
        p = blk * BLOCK + tl.arange(0, BLOCK)
        p_mask = p < n_pages
        page = tl.load(BT + b * s_btb + p, mask=p_mask, other=0)
        unit = page.to(tl.int64) * HKV + h
        d = tl.arange(0, D)
        r = tl.arange(0, R)
        t_of = r // G
        r_mask = r < G * T
        q = tl.load(
            Q + b * s_qb + t_of[:, None] * s_qt + (h * G + r % G)[:, None] * s_qh + d[None, :],
            mask=r_mask[:, None],
            other=0.0,
        ).to(tl.float32)
        base = SUMM + unit[:, None] * s_sn + d[None, :]
        if MODE == 0:
            # sum_d max(q_d kmin_d, q_d kmax_d) = max(q, 0) . kmax + min(q, 0) . kmin:
            # two matrix products instead of an [R, BLOCK, D] elementwise tensor
            kmin = tl.load(base, mask=p_mask[:, None], other=0.0)
            kmax = tl.load(base + s_sr, mask=p_mask[:, None], other=0.0)
            qp = tl.maximum(q, 0.0)
            qn = tl.minimum(q, 0.0)
            if IEEE:
                s = tl.dot(qp, tl.trans(kmax), input_precision="ieee") + tl.dot(
                    qn, tl.trans(kmin), input_precision="ieee"
                )  # [R, BLOCK]
            else:  # TF32: scores only rank pages
                s = tl.dot(qp, tl.trans(kmax)) + tl.dot(qn, tl.trans(kmin))
        else:
            ksum = tl.load(base + 2 * s_sr, mask=p_mask[:, None], other=0.0)
            n = tl.minimum(length - p * P, P).to(tl.float32)
            kmean = ksum / tl.maximum(n, 1.0)[:, None]
            if IEEE:
                s = tl.dot(q, tl.trans(kmean), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(kmean))
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        for t in tl.static_range(T):
            pooled = tl.sum(tl.where((t_of == t)[:, None] & r_mask[:, None], s, 0.0), 0)
            best = tl.maximum(best, pooled)
        best = tl.where(p_mask, best, float("-inf"))
        tl.store(OUT + b * s_ob + h * s_oh + p, best)


def page_scores(
    q: torch.Tensor,
    summ: torch.Tensor,
    block_tables: torch.Tensor,
    kv_lens: torch.Tensor,
    page_size: int,
    kv_heads: int,
    mode: str = "quest",
    block: int = 32,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """q [B, T, Hq, D]; summ [pages * Hkv, 3, D] fp32; block_tables [B, M] int32 (the
    sequences' page ids); kv_lens [B] int32. Returns scores [B, Hkv, M] fp32, -inf past
    each sequence's pages. `block`: pages per program (32 was fastest on the H200 at 128K,
    batch 8: 0.14 ms against 0.38 ms with 16 and 0.18 ms with 64)."""
    B, T, Hq, D = q.shape
    N, three, Ds = summ.shape
    M = block_tables.shape[1]
    assert three == 3 and Ds == D and summ.dtype == torch.float32, summ.shape
    assert block_tables.dtype == kv_lens.dtype == torch.int32 and kv_lens.shape == (B,)
    assert Hq % kv_heads == 0  # summ may hold extra (scratch) rows past the units
    if mode not in MODES:
        raise ValueError(f"unknown summary mode {mode!r}; use one of {', '.join(MODES)}")
    if not (HAS_TRITON and (use_triton if use_triton is not None else q.is_cuda)):
        return page_scores_reference(q, summ, block_tables, kv_lens, page_size, kv_heads, mode)
    G = Hq // kv_heads
    assert block >= 16, "tl.dot needs blocks of at least 16 pages"
    n_blocks = triton.cdiv(M, block)
    out = torch.empty(B, kv_heads, n_blocks * block, device=q.device, dtype=torch.float32)
    _page_score_kernel[(B * kv_heads, n_blocks)](
        q, summ, block_tables, kv_lens, out,
        q.stride(0), q.stride(1), q.stride(2),
        summ.stride(0), summ.stride(1),
        block_tables.stride(0), out.stride(0), out.stride(1),
        HKV=kv_heads, G=G, T=T, R=max(16, triton.next_power_of_2(G * T)), D=D,
        P=page_size, BLOCK=block, MODE=MODES[mode], IEEE=not q.is_cuda,
    )  # fmt: skip
    return out[:, :, :M]


def empty_summaries(num_units: int, head_dim: int, device=None) -> torch.Tensor:
    """A summary table for num_units (page, head) units, all empty: min +inf, max -inf,
    sum 0 (a page's summary must be reset like this before its first key is appended)."""
    summ = torch.empty(num_units, 3, head_dim, device=device, dtype=torch.float32)
    reset_summaries(summ, torch.arange(num_units, device=device))
    return summ


def reset_summaries(summ: torch.Tensor, units: torch.Tensor) -> None:
    summ[units, 0] = float("inf")
    summ[units, 1] = float("-inf")
    summ[units, 2] = 0.0


def page_scores_reference(
    q, summ, block_tables, kv_lens, page_size: int, kv_heads: int, mode: str = "quest"
):
    B, T, Hq, D = q.shape
    P, M, G = page_size, block_tables.shape[1], Hq // kv_heads
    out = torch.full((B, kv_heads, M), float("-inf"), device=q.device)
    for b in range(B):
        n = int(kv_lens[b])
        n_pages = -(-n // P)
        pages = block_tables[b, :n_pages].long()
        for h in range(kv_heads):
            s = summ[pages * kv_heads + h]  # [n_pages, 3, D]
            qh = q[b, :, h * G : (h + 1) * G].float()  # [T, G, D]
            if mode == "quest":
                prod = torch.maximum(
                    qh[:, :, None, :] * s[None, None, :, 0], qh[:, :, None, :] * s[None, None, :, 1]
                )
                per_row = prod.sum(-1)  # [T, G, n_pages]
            else:
                count = (n - torch.arange(n_pages, device=q.device) * P).clamp(max=P)
                mean = s[:, 2] / count[:, None]
                per_row = torch.einsum("tgd,pd->tgp", qh, mean)
            out[b, h, :n_pages] = per_row.sum(1).amax(0)
    return out


def select_pages(
    scores: torch.Tensor,
    kv_lens: torch.Tensor,
    page_size: int,
    budget: int,
    sink_pages: int = 1,
    window_pages: int = 2,
    tail: int = 0,
    generator: torch.Generator | None = None,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick each (sequence, head)'s pages: the sinks (first pages), the local window (last
    pages), then the top-scoring others up to `budget` pages in all, plus `tail` more drawn
    at random in proportion to exp(score) from the rest (vAttention-style). Returns
    (pages [B, Hkv, K] int32 in ascending order, counts [B, Hkv] int32); entries past a
    count are 0. `width` fixes K (at least budget + tail) so nothing waits for the host and
    the call can be captured in a CUDA graph; by default K is the largest count."""
    B, Hkv, M = scores.shape
    n_pages = (kv_lens.long() + page_size - 1) // page_size  # [B]
    idx = torch.arange(M, device=scores.device)
    valid = idx[None, :] < n_pages[:, None]  # [B, M]
    forced = valid & (
        (idx[None, :] < sink_pages) | (idx[None, :] >= n_pages[:, None] - window_pages)
    )
    s = scores.masked_fill(~valid[:, None, :], float("-inf"))
    s = torch.where(forced[:, None, :], torch.full_like(s, float("inf")), s)
    k = min(M, budget)
    top = torch.topk(s, k, dim=-1)
    if tail == 0:  # the top-k set is the selection: sort its k indices only
        keep = top.values > float("-inf")
        counts = keep.sum(-1).to(torch.int32)
        idx_sorted = torch.sort(torch.where(keep, top.indices, M), dim=-1).values
        if width is None:
            width = max(1, int(counts.max()))
        width = min(width, M)
        if width > k:
            pad = torch.full((B, Hkv, width - k), M, device=scores.device, dtype=idx_sorted.dtype)
            idx_sorted = torch.cat([idx_sorted, pad], -1)
        idx_sorted = idx_sorted[..., :width]
        return torch.where(idx_sorted < M, idx_sorted, 0).to(torch.int32), counts
    chosen = torch.zeros(B, Hkv, M, dtype=torch.bool, device=scores.device)
    chosen.scatter_(-1, top.indices, torch.isfinite(top.values) | (top.values == float("inf")))
    chosen &= valid[:, None, :]
    if tail > 0 and width is not None:
        raise ValueError("the stochastic tail needs the host (multinomial); leave width unset")
    if tail > 0:
        rest = valid[:, None, :] & ~chosen
        top_rest = scores.masked_fill(~rest, float("-inf")).amax(-1, keepdim=True)
        w = torch.exp(scores - top_rest).masked_fill(~rest, 0.0).nan_to_num(0.0)
        w = w.reshape(B * Hkv, M)
        has = (w > 0).sum(-1) >= 1
        if has.any():
            rows = w[has]
            n = min(tail, M)
            # multinomial without replacement needs n positive weights: pad with tiny ones
            # on already-chosen pages (dropped again below)
            pick = torch.multinomial(rows + 1e-30, n, replacement=False, generator=generator)
            extra = torch.zeros_like(rows, dtype=torch.bool)
            extra.scatter_(-1, pick, True)
            extra &= rows > 0
            flat = chosen.reshape(B * Hkv, M)
            flat[has] |= extra
    counts = chosen.sum(-1).to(torch.int32)
    if width is None:
        width = max(1, int(counts.max()))
    width = min(width, M)
    # ascending page order: the selected indices first (stable sort on "not chosen")
    order = torch.sort((~chosen).to(torch.int8), dim=-1, stable=True).indices[..., :width]
    pages = torch.where(torch.arange(width, device=scores.device) < counts[..., None], order, 0).to(
        torch.int32
    )
    return pages, counts
