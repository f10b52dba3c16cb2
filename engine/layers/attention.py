"""Attention over the paged KV cache.

The pool of one layer is [num_pages, Hkv, 2, page_size, D]: for each (page, KV head) the K
and V rows are one contiguous block, the unit the tiered cache moves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.layers.step_context import StepContext
from kernels.fp8 import to_kv


def gather_kv(
    kv: torch.Tensor, pages: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `length` K and V rows of one sequence: [Hkv, length, D] each.

    Gathering along the page axis of a [Hkv, 2, N, P, D] view gives K and V of each head as
    contiguous rows in one copy (on CPU, 11x faster than indexing pages then reshaping:
    89 us vs 1010 us for 32 pages of SmolLM2)."""
    g = kv.permute(1, 2, 0, 3, 4).index_select(2, pages)  # [Hkv, 2, n, P, D]
    hkv, _, n, p, d = g.shape
    return g[:, 0].reshape(hkv, n * p, d)[:, :length], g[:, 1].reshape(hkv, n * p, d)[:, :length]


def gather_kv_from_host(
    kv: torch.Tensor, pages: torch.Tensor, length: int, device: torch.device,
    use_triton: bool | None = None, head: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """gather_kv for a pool in pinned host memory: the UVA gather kernel copies each page's
    K half and V half straight to their places in [2, Hkv, pages, P, D] on the GPU, so K and
    V come out as [Hkv, length, D] views with no further copy. `head`: that KV head only
    ([1, length, D] each: at 500K tokens 0.24 GiB instead of 1.9 GiB for all 8 heads)."""
    from kernels.uva_gather import gather_pages
    from kernels.views import GatherLaunch

    n_pages, hkv, _, p, d = kv.shape
    assert p % 2 == 0
    n = pages.numel()
    heads = (
        torch.arange(hkv, device=device) if head is None else torch.tensor([head], device=device)
    )
    nh = heads.numel()
    # half-units of [2, P/2, D] elements: source (page, head, k|v) -> (k|v, head, page)
    pg = pages.to(device).long()[None, :, None]
    c = torch.arange(2, device=device)[:, None, None]
    src = ((pg * hkv + heads[None, None, :]) * 2 + c).reshape(-1)
    slot = torch.arange(nh, device=device)[None, None, :]
    dst = ((c * nh + slot) * n + torch.arange(n, device=device)[None, :, None]).reshape(-1)
    out = torch.empty(2, nh, n, p, d, dtype=kv.dtype, device=device)
    gather_pages(kv.view(-1, 2, p // 2, d), out.view(-1, 2, p // 2, d), src.to(torch.int32),
                 dst.to(torch.int32), GatherLaunch(132, use_triton=use_triton))  # fmt: skip
    kv_rows = out.view(2, nh, n * p, d)[:, :, :length]
    return kv_rows[0], kv_rows[1]


def host_tier_attention(
    q: torch.Tensor, kv: torch.Tensor, pages: torch.Tensor, kv_len: int, scale: float,
    use_triton: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """Dense attention of a prefill chunk at the end of a sequence whose KV is in the host
    tier: q [1, Hq, T, D] -> [1, Hq, T, D]. One KV head at a time is gathered to the GPU and
    serves its query heads (lower-right causal), so the GPU holds one head's K and V of the
    context at a time, never the whole layer's."""
    Hq = q.shape[1]
    groups = Hq // kv.shape[1]
    out = torch.empty_like(q)
    for h in range(kv.shape[1]):
        k, v = gather_kv_from_host(kv, pages, kv_len, q.device, use_triton, head=h)
        heads = slice(h * groups, (h + 1) * groups)
        out[:, heads] = lower_right_causal(q[:, heads], k.to(q.dtype), v.to(q.dtype), scale)
    return out


def causal_mask(q_len: int, kv_len: int, window: int | None, device) -> torch.Tensor | None:
    """Boolean mask [q_len, kv_len] (True = attend); None when plain causal SDPA applies."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= q_pos - k_pos < window
    return mask


# Up to this many bytes, lower_right_causal expands K and V to every query head and runs
# one call; past it, one call per query head (8 GB of expanded K and V at 500K tokens)
EXPAND_KV_BYTES = 256 << 20


def lower_right_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """A chunk of queries at the end of a longer sequence: q [1, Hq, T, D], k/v [Hkv, S, D],
    S >= T, query i sees keys up to S - T + i. The lower-right causal bias lets SDPA run the
    memory-efficient kernel instead of the math path, which materialises [Hq, T, S] scores
    (at T = 16K, S = 128K: 272 GB). That kernel takes no GQA: K and V expanded to every
    query head where that is small (EXPAND_KV_BYTES), else one query head at a time against
    its KV head. (One call per head cost 32 Python dispatches of ~65 us per layer: an 8B
    model's chunked prefill of 16 short prompts took 0.16 s a step on the H200.)"""
    from torch.nn.attention.bias import causal_lower_right

    Hq, Hkv = q.shape[1], k.shape[0]
    groups = Hq // Hkv
    bias = causal_lower_right(q.shape[2], k.shape[1])
    if 2 * Hq * k[0].numel() * k.element_size() <= EXPAND_KV_BYTES:
        kx = k.repeat_interleave(groups, dim=0)[None]  # [1, Hq, S, D]
        vx = v.repeat_interleave(groups, dim=0)[None]
        return F.scaled_dot_product_attention(q, kx, vx, attn_mask=bias, scale=scale)
    out = torch.empty_like(q)
    for h in range(Hq):
        kh, vh = k[h // groups][None, None], v[h // groups][None, None]
        out[:, h : h + 1] = F.scaled_dot_product_attention(
            q[:, h : h + 1], kh, vh, attn_mask=bias, scale=scale
        )
    return out


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: torch.Tensor,
    ctx: StepContext,
    scale: float,
    layer: int = 0,
) -> torch.Tensor:
    """q: [T, Hq, D] (k, v: this step's rows, already stored in kv) -> [T, Hq, D]."""
    if ctx.decode_only and q.is_cuda and ctx.sliding_window is None:
        return _paged_kernel(q, kv, ctx, scale)
    if ctx.verify and q.is_cuda and kv.is_cuda and ctx.block_tables is not None:
        # each of a verification's queries as one decode row: its sequence's table and its
        # own length (ctx.block_tables / kv_lens_t per query, filled by the runner)
        return _paged_kernel(q, kv, ctx, scale)
    return _attention_per_sequence(q, k, v, kv, ctx, scale, layer)


def per_query_tables(page_lists, kv_lens: list[int], T: int) -> tuple[list, list[int]]:
    """A verification's B * T queries as decode rows: each query's row repeats its
    sequence's pages (padded to one width) and its length counts the keys it sees (query t
    of a sequence of kv_len tokens sits at kv_len - T + t). Returns (rows, lengths)."""
    width = max(len(p) for p in page_lists)
    rows = []
    for pages in page_lists:
        rows += [[int(x) for x in pages] + [0] * (width - len(pages))] * T
    return rows, query_lengths(kv_lens, T)


def query_lengths(kv_lens: list[int], T: int) -> list[int]:
    """The keys each of a verification's queries sees, sequence by sequence: query t of a
    sequence of n tokens (the last T its queries) sees n - T + 1 + t."""
    return [n - T + 1 + t for n in kv_lens for t in range(T)]


def _paged_kernel(q: torch.Tensor, kv: torch.Tensor, ctx: StepContext, scale: float):
    from kernels.paged_decode import paged_decode_attention
    from kernels.views import PagedKV

    cache = PagedKV(kv, ctx.block_tables, ctx.kv_lens_t)
    return paged_decode_attention(q, cache, scale, num_splits=ctx.attn_splits)


def _decode_attention_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query token, GQA: q [1, Hq, 1, D], k/v [Hkv, L, D] -> [1, Hq, 1, D]. Two bmm and a
    softmax beat the CPU flash kernel for a single query (694 us vs 1015 us at 7.5K tokens)."""
    hkv, L, d = k.shape
    qg = q.reshape(hkv, -1, d).contiguous()  # [Hkv, G, D]: the query heads of one KV head
    p = torch.softmax(torch.bmm(qg, k.transpose(1, 2)).mul_(scale), dim=-1)
    return torch.bmm(p, v).view(q.shape)


def _verify_attention_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """The T queries of a verification, q [1, Hq, T, D] at the last T of k/v's [Hkv, L, D]
    positions, each computed by the single-token path over its own keys, so bit for bit as
    its decode step computes it (greedy speculation must give the tokens plain decoding
    gives). One product over all T queries would read K and V once, not T times, but a
    GEMM's rows do not always sum as a one-query product's: MKL on an AVX-512 EPYC sums 4
    or more rows in another order than 1 to 3 (in the last bits), so that is not exact on
    every CPU (tests/engine/test_speculative.py)."""
    T, L = q.shape[2], k.shape[1]
    out = torch.empty_like(q)
    for t in range(T):
        n = L - T + 1 + t
        one = q[:, :, t : t + 1].contiguous()
        out[:, :, t : t + 1] = _decode_attention_cpu(one, k[:, :n], v[:, :n], scale)
    return out


def _attention_per_sequence(
    q, k, v, kv, ctx: StepContext, scale: float, layer: int
) -> torch.Tensor:
    out = torch.empty_like(q) if len(ctx.query_lens) > 1 else q
    start = 0
    dense = ctx.dense_kv or [None] * len(ctx.query_lens)
    for i, (q_len, kv_len, pages) in enumerate(
        zip(ctx.query_lens, ctx.kv_lens, ctx.page_lists, strict=True)
    ):
        end = start + q_len
        if dense[i] is not None:  # a contiguous copy of this sequence's rows (CPU)
            ks, vs = dense[i].extend(layer, kv, pages, kv_len - q_len, k[start:end], v[start:end])
        elif kv_len == q_len:  # the whole sequence is in this step: no need to read the cache
            ks, vs = k[start:end].transpose(0, 1), v[start:end].transpose(0, 1)
            if kv.dtype != k.dtype:  # an fp8 pool: its rows as it holds them (a prompt
                # attends alike whether its prefix was cached or not)
                ks, vs = to_kv(ks, kv.dtype), to_kv(vs, kv.dtype)
        elif q.is_cuda and not kv.is_cuda and q_len > 1 and not ctx.sliding_window:
            # the host tier: one KV head of the context on the GPU at a time
            qs = q[start:end].transpose(0, 1)[None]
            o = host_tier_attention(qs, kv, pages, kv_len, scale)
            if len(ctx.query_lens) == 1:
                return o[0].transpose(0, 1)
            out[start:end] = o[0].transpose(0, 1)
            start = end
            continue
        elif q.is_cuda and not kv.is_cuda:  # the host tier: bring the pages over first
            ks, vs = gather_kv_from_host(kv, pages, kv_len, q.device)
        else:
            ks, vs = gather_kv(kv, pages, kv_len)
        if ks.dtype != q.dtype:  # an fp8 pool's rows (EngineConfig.kv_dtype)
            ks, vs = ks.to(q.dtype), vs.to(q.dtype)
        window = ctx.sliding_window if ctx.sliding_window and kv_len > ctx.sliding_window else None
        qs = q[start:end].transpose(0, 1)[None]  # [1, Hq, q_len, D]
        if ctx.verify and window is None and not q.is_cuda:
            o = _verify_attention_cpu(qs, ks, vs, scale)
            if len(ctx.query_lens) == 1:
                return o[0].transpose(0, 1)
            out[start:end] = o[0].transpose(0, 1)
            start = end
            continue
        if ctx.prefill_attn_dtype is not None and q_len > 1:
            # compute-bound prefill attention in bf16 (AMX on the CPU: 2.1x faster at 512 x 4096)
            qs, ks, vs = (t.to(ctx.prefill_attn_dtype) for t in (qs, ks, vs))
        if q_len == 1 and window is None and not q.is_cuda:
            o = _decode_attention_cpu(qs, ks, vs, scale)
        elif q_len == 1 and window is None:
            o = F.scaled_dot_product_attention(qs, ks[None], vs[None], scale=scale, enable_gqa=True)
        elif q_len == kv_len and window is None:
            o = F.scaled_dot_product_attention(
                qs, ks[None], vs[None], is_causal=True, scale=scale, enable_gqa=True
            )
        elif window is None and q.is_cuda:
            o = lower_right_causal(qs, ks, vs, scale)
        else:
            mask = causal_mask(q_len, kv_len, window, q.device)
            o = F.scaled_dot_product_attention(
                qs, ks[None], vs[None], attn_mask=mask, scale=scale, enable_gqa=True
            )
        if len(ctx.query_lens) == 1:
            return o[0].transpose(0, 1)  # one sequence: no copy into `out`
        out[start:end] = o[0].transpose(0, 1)
        start = end
    return out
