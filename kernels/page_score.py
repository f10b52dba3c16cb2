"""Page scoring for sparse attention.

Every page of every (sequence, KV head) has a summary of its keys, kept on the GPU:
`summ [N, R, D]` per layer, with the unit layout of the KV pools (unit = page * Hkv +
head). Layouts (`summary_rows`):
- R = 3, fp32: the elementwise min of the page's keys, their max, their sum (both modes);
- R = 2, "quest" only: min and max, in the keys' own dtype (exact: min and max of bf16 keys
  are bf16 values; half the bytes of fp32 for the scoring kernel to read; an fp8 pool's
  keys are fp8 values, so its summaries are fp8: a quarter);
- R = 1, "mean" only: the sum, fp32.

A page's score for one query row q:
- "quest": sum_d max(q_d * kmin_d, q_d * kmax_d), an upper bound on q.k over the page
  (Quest);
- "mean": q . (ksum / n), the dot product with the page's mean key.
Rows are pooled per (sequence, KV head): summed over the query heads of the GQA group,
then the max over the T query tokens (a verification's queries share one selection).

`page_scores` runs the Triton kernel (grid: (B * Hkv, page blocks)); kernels.page_topk turns
scores into page lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import HAS_TRITON
from kernels.fp8 import FP8, FP8_MAX_BITS
from kernels.views import PageTable

MODES = {"quest": 0, "mean": 1}

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _page_score_kernel(
        Q, SUMM, BT, LENS, OUT,
        s_qb, s_qt, s_qh,
        s_sn, s_sr,
        s_btb, s_ob, s_ot, s_oh,
        HKV: tl.constexpr, G: tl.constexpr, T: tl.constexpr, R: tl.constexpr,
        D: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr,
        IEEE: tl.constexpr, ROW_MIN: tl.constexpr, ROW_MAX: tl.constexpr, ROW_SUM: tl.constexpr,
        PER_QUERY: tl.constexpr,
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
            kmin = tl.load(base + ROW_MIN * s_sr, mask=p_mask[:, None], other=0.0).to(tl.float32)
            kmax = tl.load(base + ROW_MAX * s_sr, mask=p_mask[:, None], other=0.0).to(tl.float32)
            qp = tl.maximum(q, 0.0)
            qn = tl.minimum(q, 0.0)
            if IEEE:
                s = tl.dot(qp, tl.trans(kmax), input_precision="ieee") + tl.dot(
                    qn, tl.trans(kmin), input_precision="ieee"
                )  # [R, BLOCK]
            else:  # TF32: scores only rank pages
                s = tl.dot(qp, tl.trans(kmax)) + tl.dot(qn, tl.trans(kmin))
        elif PER_QUERY:  # each query's own length counts its last page's keys
            ksum = tl.load(base + ROW_SUM * s_sr, mask=p_mask[:, None], other=0.0).to(tl.float32)
            if IEEE:
                s = tl.dot(q, tl.trans(ksum), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(ksum))
        else:
            ksum = tl.load(base + ROW_SUM * s_sr, mask=p_mask[:, None], other=0.0).to(tl.float32)
            n = tl.minimum(length - p * P, P).to(tl.float32)
            kmean = ksum / tl.maximum(n, 1.0)[:, None]
            if IEEE:
                s = tl.dot(q, tl.trans(kmean), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(kmean))
        if PER_QUERY:
            # a verification: query t sits at position length - T + t and sees that many
            # keys; its row of scores is its own (one read of the summaries for all T)
            for t in tl.static_range(T):
                pooled = tl.sum(tl.where((t_of == t)[:, None] & r_mask[:, None], s, 0.0), 0)
                len_t = length - T + 1 + t
                if MODE == 1:
                    pooled = pooled / tl.maximum(tl.minimum(len_t - p * P, P).to(tl.float32), 1.0)
                pooled = tl.where(p < tl.cdiv(len_t, P), pooled, float("-inf"))
                tl.store(OUT + b * s_ob + t * s_ot + h * s_oh + p, pooled)
        else:
            best = tl.full([BLOCK], float("-inf"), tl.float32)
            for t in tl.static_range(T):
                pooled = tl.sum(tl.where((t_of == t)[:, None] & r_mask[:, None], s, 0.0), 0)
                best = tl.maximum(best, pooled)
            best = tl.where(p_mask, best, float("-inf"))
            tl.store(OUT + b * s_ob + h * s_oh + p, best)


if HAS_TRITON:
    # On a GPU the block of pages per program, the warps and the pipeline depth are tuned once
    # per (table width, query rows, mode) by timing (triton.autotune): the first version's
    # fixed 32 pages and 4 warps read the summaries at ~1.4 TB/s of the H200's ~4.
    _page_score_tuned = triton.autotune(
        configs=[
            triton.Config({"BLOCK": b}, num_warps=w, num_stages=st)
            for b in (32, 64, 128)
            for w in (2, 4, 8)
            for st in (1, 3)
        ],
        key=["s_btb", "T", "G", "MODE", "HKV", "PER_QUERY"],
    )(_page_score_kernel)
    _TUNED_KEYS: set = set()  # keys already tuned (never tune inside a CUDA-graph capture)


@dataclass(frozen=True, slots=True)
class PageSummaries:
    """A layer's page summaries: summ [pages * Hkv, R, D] (a `summary_rows` layout that
    holds `mode`'s rows; it may hold extra scratch rows past the units), kv_heads Hkv, mode
    "quest" or "mean"."""

    summ: torch.Tensor
    kv_heads: int
    mode: str = "quest"


def page_scores(
    q: torch.Tensor,
    summaries: PageSummaries,
    table: PageTable,
    block: int = 32,
    use_triton: bool | None = None,
    per_query: bool = False,
) -> torch.Tensor:
    """q [B, T, Hq, D]; the summaries; the sequences' page table (block_tables [B, M] int32,
    kv_lens [B] int32). Returns scores [B, Hkv, M] fp32 (the max over the T queries), -inf
    past each sequence's pages. `per_query`: scores [B, T, Hkv, M], query t's own (it sits
    at position kv_len - T + t: -inf past its pages), for a verification's per-query
    selections; the summaries are read once for all T. `block`: pages per program where not
    autotuned (32 was fastest on the H200 at 128K, batch 8: 0.14 ms against 0.38 ms with 16
    and 0.18 ms with 64)."""
    summ, kv_heads, mode = summaries.summ, summaries.kv_heads, summaries.mode
    block_tables, kv_lens, page_size = table.block_tables, table.kv_lens, table.page_size
    B, T, Hq, D = q.shape
    N, R, Ds = summ.shape
    M = block_tables.shape[1]
    assert Ds == D, summ.shape
    assert block_tables.dtype == kv_lens.dtype == torch.int32 and kv_lens.shape == (B,)
    assert Hq % kv_heads == 0  # summ may hold extra (scratch) rows past the units
    if mode not in MODES:
        raise ValueError(f"unknown summary mode {mode!r}; use one of {', '.join(MODES)}")
    rows = _rows(summ, mode)
    if not (HAS_TRITON and (use_triton if use_triton is not None else q.is_cuda)):
        ref = page_scores_reference
        if not per_query:
            return ref(q, summaries, table)
        return torch.stack([ref(q[:, t : t + 1], summaries,
                                PageTable(block_tables, kv_lens - (T - 1 - t), page_size))
                            for t in range(T)], 1)  # fmt: skip
    G = Hq // kv_heads
    assert block >= 16, "tl.dot needs blocks of at least 16 pages"
    args = dict(HKV=kv_heads, G=G, T=T, R=max(16, triton.next_power_of_2(G * T)), D=D,
                P=page_size, MODE=MODES[mode], IEEE=not q.is_cuda, ROW_MIN=rows["min"],
                ROW_MAX=rows["max"], ROW_SUM=rows["sum"], PER_QUERY=per_query)  # fmt: skip
    key = (block_tables.stride(0), T, G, MODES[mode], kv_heads, summ.dtype, per_query)

    def new_out(width: int) -> torch.Tensor:
        shape = (B, T, kv_heads, width) if per_query else (B, 1, kv_heads, width)
        return torch.empty(shape, device=q.device, dtype=torch.float32)

    def strides(out: torch.Tensor) -> tuple[int, int, int]:
        return out.stride(0), out.stride(1), out.stride(2)

    def result(out: torch.Tensor) -> torch.Tensor:
        return out[..., :M] if per_query else out[:, 0, :, :M]

    tune = q.is_cuda and (key in _TUNED_KEYS or not torch.cuda.is_current_stream_capturing())
    if tune:  # room for the largest tuned block
        out = new_out(triton.cdiv(M, 128) * 128)
        try:
            _page_score_tuned[lambda meta: (B * kv_heads, triton.cdiv(M, meta["BLOCK"]))](
                q, summ, block_tables, kv_lens, out,
                q.stride(0), q.stride(1), q.stride(2), summ.stride(0), summ.stride(1),
                block_tables.stride(0), *strides(out), **args,
            )  # fmt: skip
            _TUNED_KEYS.add(key)
            return result(out)
        except Exception:  # noqa: BLE001 (fall back to the fixed configuration below)
            pass
    n_blocks = triton.cdiv(M, block)
    out = new_out(n_blocks * block)
    _page_score_kernel[(B * kv_heads, n_blocks)](
        q, summ, block_tables, kv_lens, out,
        q.stride(0), q.stride(1), q.stride(2),
        summ.stride(0), summ.stride(1),
        block_tables.stride(0), *strides(out), BLOCK=block, **args,
    )  # fmt: skip
    return result(out)


def summary_rows(mode: str | None) -> dict[str, int]:
    """Row index of each statistic in a summary table: both modes (None) keep all three,
    "quest" only min and max, "mean" only the sum."""
    return {None: {"min": 0, "max": 1, "sum": 2}, "quest": {"min": 0, "max": 1, "sum": -1},
            "mean": {"min": -1, "max": -1, "sum": 0}}[mode]  # fmt: skip


def _rows(summ: torch.Tensor, mode: str) -> dict[str, int]:
    rows = summary_rows({3: None, 2: "quest", 1: "mean"}.get(summ.shape[1], "?"))
    need = ("min", "max") if mode == "quest" else ("sum",)
    assert all(rows[r] >= 0 for r in need), f"a {summ.shape[1]}-row summary has no {need}"
    assert mode == "quest" or summ.dtype == torch.float32, "sums are kept in fp32"
    return rows


def empty_summaries(num_units: int, head_dim: int, device=None, mode: str | None = None,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:  # fmt: skip
    """A summary table for num_units (page, head) units, all empty: min +inf, max -inf,
    sum 0 (a page's summary must be reset like this before its first key is appended).
    `mode`: the rows to keep (see `summary_rows`); `dtype` (quest only): the keys' dtype
    (fp8: an fp8 pool's, its extremes +-448 for the infinities)."""
    n_rows = {None: 3, "quest": 2, "mean": 1}[mode]
    if mode != "quest":
        dtype = torch.float32
    summ = torch.empty(num_units, n_rows, head_dim, device=device, dtype=dtype)
    reset_summaries(summ, torch.arange(num_units, device=device))
    return summ


def reset_summaries(summ: torch.Tensor, units: torch.Tensor) -> None:
    rows = summary_rows({3: None, 2: "quest", 1: "mean"}[summ.shape[1]])
    if summ.dtype == FP8:  # (no infinities: fp8's extremes, past which no key is stored)
        bits = summ.view(torch.uint8)
        bits[units, rows["min"]] = FP8_MAX_BITS
        bits[units, rows["max"]] = FP8_MAX_BITS | 0x80
        return
    if rows["min"] >= 0:
        summ[units, rows["min"]] = float("inf")
        summ[units, rows["max"]] = float("-inf")
    if rows["sum"] >= 0:
        summ[units, rows["sum"]] = 0.0


def page_scores_reference(q, summaries: PageSummaries, table: PageTable) -> torch.Tensor:
    """page_scores in torch, one (sequence, KV head) at a time."""
    summ, kv_heads, mode = summaries.summ, summaries.kv_heads, summaries.mode
    block_tables, kv_lens, page_size = table.block_tables, table.kv_lens, table.page_size
    B, T, Hq, D = q.shape
    P, M, G = page_size, block_tables.shape[1], Hq // kv_heads
    rows = _rows(summ, mode)
    out = torch.full((B, kv_heads, M), float("-inf"), device=q.device)
    for b in range(B):
        n = int(kv_lens[b])
        n_pages = -(-n // P)
        pages = block_tables[b, :n_pages].long()
        for h in range(kv_heads):
            s = summ[pages * kv_heads + h].float()  # [n_pages, R, D]
            qh = q[b, :, h * G : (h + 1) * G].float()  # [T, G, D]
            if mode == "quest":
                kmin, kmax = s[None, None, :, rows["min"]], s[None, None, :, rows["max"]]
                prod = torch.maximum(qh[:, :, None, :] * kmin, qh[:, :, None, :] * kmax)
                per_row = prod.sum(-1)  # [T, G, n_pages]
            else:
                count = (n - torch.arange(n_pages, device=q.device) * P).clamp(max=P)
                mean = s[:, rows["sum"]] / count[:, None]
                per_row = torch.einsum("tgd,pd->tgp", qh, mean)
            out[b, h, :n_pages] = per_row.sum(1).amax(0)
    return out
