"""Top-k page selection for sparse attention: each (sequence, KV head) keeps its sinks
(first pages), its local window (last pages) and its top-scoring other pages up to a budget
(kernels.page_score gives the scores), with an optional stochastic tail.

Methods (the same pages; ties go to the lowest pages):
- "probe2": one program per row, the row in registers: the k-th largest score's bits found
  2 bits per round, each round's 4 candidate thresholds counted in one block reduction;
- "hist": the same program with the threshold found a byte per round from a 256-bin
  histogram;
- "split" (kernels.page_topk_split): each row over programs of SPLIT_CHUNK pages (a row's
  select on one SM took 137 us at 500K);
- "torch": topk and a sort (0.14 ms at 128K, batch 8), and the only one with a tail.
Which is fastest depends on the rows and the scores' spread (bench.select_bench,
docs/benchmarks.md); the engine times them per shape (engine.kv.select_methods).
"""

from __future__ import annotations

import torch

from kernels import HAS_TRITON
from kernels.page_topk_split import select_split
from kernels.views import SelectRule

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.page_topk_split import _probe_keys

if HAS_TRITON:

    @triton.jit
    def _row_start(LENS, BUDGETS, budget, HKV: tl.constexpr, P: tl.constexpr,
                   HAS_BUDGETS: tl.constexpr):  # fmt: skip
        """A selection program's row: (row index, sequence, KV head, the sequence's pages,
        its k: the step's budget, or its own where given, at most its pages)."""
        bh = tl.program_id(0)
        b = bh // HKV
        n_pages = tl.cdiv(tl.load(LENS + b), P)
        if HAS_BUDGETS:
            budget = tl.minimum(tl.load(BUDGETS + b), budget)
        return bh, b, bh % HKV, n_pages, tl.minimum(budget, n_pages)

    @triton.jit
    def _select_probe_kernel(
        S, LENS, BUDGETS, OUT, CNT, budget,
        s_sb, s_sh, s_ob, s_oh,
        HKV: tl.constexpr, P: tl.constexpr, SINKS: tl.constexpr, WINDOW: tl.constexpr,
        WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr,
        HAS_BUDGETS: tl.constexpr, BITS: tl.constexpr,
    ):  # fmt: skip
        """The bisection's selection with BITS bits of the k-th largest key per round: the
        2^BITS candidate thresholds of a round are counted in one block reduction of a
        [2^BITS, BLOCK] comparison (32 / BITS rounds instead of 32), and the keys are
        int32 (half the registers of the bisection's int64 ones: rows up to 32K pages). A
        row is BLOCK pages (a power of two) plus a TAIL block (0: none) for the pages past
        it: a row of 8,196 pages holds 8,192 + 16 keys, not 16,384."""
        bh, b, h, n_pages, k = _row_start(LENS, BUDGETS, budget, HKV, P, HAS_BUDGETS)
        row = S + b * s_sb + h * s_sh
        p = tl.arange(0, BLOCK)
        key = _probe_keys(row, p, n_pages, SINKS, WINDOW)
        if TAIL > 0:
            pt = BLOCK + tl.arange(0, TAIL)
            key_t = _probe_keys(row, pt, n_pages, SINKS, WINDOW)
        # invariant: at least k keys have u >= prefix; each round fixes the next BITS bits
        # of the largest such threshold (the k-th largest u) from the counts of its
        # 2^BITS candidates (d = 0, the prefix itself, always qualifies)
        d = tl.arange(0, 1 << BITS).to(tl.int64)
        prefix = tl.zeros([], tl.int64)
        for r in tl.static_range(32 // BITS):
            shift = 32 - BITS * (r + 1)
            thr = (prefix + (d << shift) - 2147483648).to(tl.int32)
            n_at_least = tl.sum((key[None, :] >= thr[:, None]).to(tl.int32), 1)
            if TAIL > 0:
                n_at_least += tl.sum((key_t[None, :] >= thr[:, None]).to(tl.int32), 1)
            best = tl.max(tl.where(n_at_least >= k, d, 0), 0)
            prefix = prefix + (best << shift)
        t = (prefix - 2147483648).to(tl.int32)
        if TAIL == 0:  # (unused: no tail)
            key_t, pt = key, p
        _store_top(OUT + b * s_ob + h * s_oh, CNT + bh, key, p, key_t, pt, t, k, n_pages,
                   WIDTH, WIDTH_P2, TAIL)  # fmt: skip

    @triton.jit
    def _store_top(out, cnt, key, p, key_t, pt, t, k, n_pages, WIDTH: tl.constexpr,
                   WIDTH_P2: tl.constexpr, TAIL: tl.constexpr):  # fmt: skip
        """A row's selection from its k-th largest key t: every key above t, and the first
        `k - (keys above)` keys equal to t (lowest pages), in page order; then the count,
        and zeros up to WIDTH."""
        valid = p < n_pages
        above = valid & (key > t)
        tie = valid & (key == t)
        n_above = tl.sum(above.to(tl.int32), 0)
        if TAIL > 0:
            valid_t = pt < n_pages
            above_t = valid_t & (key_t > t)
            tie_t = valid_t & (key_t == t)
            n_above += tl.sum(above_t.to(tl.int32), 0)
        ties_wanted = k - n_above
        chosen = above | (tie & (tl.cumsum(tie.to(tl.int32), 0) - 1 < ties_wanted))
        pos = tl.cumsum(chosen.to(tl.int32), 0) - 1
        tl.store(out + pos, p, mask=chosen & (pos < WIDTH))
        written = tl.sum(chosen.to(tl.int32), 0)
        if TAIL > 0:
            tie_rank = tl.sum(tie.to(tl.int32), 0) + tl.cumsum(tie_t.to(tl.int32), 0) - 1
            chosen_t = above_t | (tie_t & (tie_rank < ties_wanted))
            pos_t = written + tl.cumsum(chosen_t.to(tl.int32), 0) - 1
            tl.store(out + pos_t, pt, mask=chosen_t & (pos_t < WIDTH))
            written += tl.sum(chosen_t.to(tl.int32), 0)
        tl.store(cnt, written)
        w = tl.arange(0, WIDTH_P2)
        tl.store(out + w, tl.zeros([WIDTH_P2], tl.int32), mask=(w >= written) & (w < WIDTH))

    @triton.jit
    def _select_hist_kernel(
        S, LENS, BUDGETS, OUT, CNT, budget,
        s_sb, s_sh, s_ob, s_oh,
        HKV: tl.constexpr, P: tl.constexpr, SINKS: tl.constexpr, WINDOW: tl.constexpr,
        WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr,
        HAS_BUDGETS: tl.constexpr,
    ):  # fmt: skip
        """The probe kernel's selection with the k-th largest key found a byte at a time:
        each of 4 rounds takes a 256-bin histogram of the next byte of the keys whose
        higher bytes equal the threshold's so far, and the suffix sums of that histogram
        give the byte (4 rounds instead of the probe's 16 or 32)."""
        bh, b, h, n_pages, k = _row_start(LENS, BUDGETS, budget, HKV, P, HAS_BUDGETS)
        row = S + b * s_sb + h * s_sh
        p = tl.arange(0, BLOCK)
        key = _probe_keys(row, p, n_pages, SINKS, WINDOW)
        u = key.to(tl.uint32, bitcast=True) ^ 0x80000000  # the same order, unsigned
        if TAIL > 0:
            pt = BLOCK + tl.arange(0, TAIL)
            key_t = _probe_keys(row, pt, n_pages, SINKS, WINDOW)
            u_t = key_t.to(tl.uint32, bitcast=True) ^ 0x80000000
        else:  # (unused: no tail)
            key_t, pt = key, p
        bins = tl.arange(0, 256)
        n_greater = tl.zeros([], tl.int32)  # keys whose decided bytes exceed the prefix's
        prefix = tl.zeros([], tl.uint32)  # the threshold's bytes decided so far
        for r in tl.static_range(4):
            byte = ((u >> (24 - 8 * r)) & 255).to(tl.int32)
            if r == 0:
                hist = tl.histogram(byte, 256)
            else:
                hist = tl.histogram(byte, 256, mask=(u >> (32 - 8 * r)) == prefix)
            if TAIL > 0:
                byte_t = ((u_t >> (24 - 8 * r)) & 255).to(tl.int32)
                if r == 0:
                    hist += tl.histogram(byte_t, 256)
                else:
                    hist += tl.histogram(byte_t, 256, mask=(u_t >> (32 - 8 * r)) == prefix)
            # keys with this byte >= d (and the decided bytes equal): the largest d with at
            # least k keys at or above it is the threshold's byte
            at_least = n_greater + tl.cumsum(hist, 0, reverse=True)
            best = tl.max(tl.where(at_least >= k, bins, 0), 0)
            n_greater += tl.sum(tl.where(bins > best, hist, 0), 0)
            prefix = (prefix << 8) | best.to(tl.uint32)
        t = (prefix ^ 0x80000000).to(tl.int32, bitcast=True)
        _store_top(OUT + b * s_ob + h * s_oh, CNT + bh, key, p, key_t, pt, t, k, n_pages,
                   WIDTH, WIDTH_P2, TAIL)  # fmt: skip


METHODS = ("probe2", "hist", "split", "torch")
# the kernels that hold a whole row in registers: the longest row each takes
MAX_PAGES = {"probe2": 32768, "hist": 32768}


def select_pages(
    scores: torch.Tensor,
    kv_lens: torch.Tensor,
    rule: SelectRule,
    budgets: torch.Tensor | None = None,
    method: str = "torch",
    tail: int = 0,
    generator: torch.Generator | None = None,
    use_triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick each (sequence, head)'s pages by `rule`, plus `tail` more drawn at random in
    proportion to exp(score) from the rest (vAttention-style). Returns (pages [B, Hkv, K]
    int32 in ascending order, counts [B, Hkv] int32); entries past a count are 0.
    `budgets` [B] int (optional, each at most the rule's): each sequence's own budget (from
    its own length: a sequence selects the same pages whatever else is in its batch, and
    each query of a verification as if decoded alone). `method`: one of METHODS; a Triton
    one runs where there is no tail, the width is fixed and Triton runs (on a GPU, or
    use_triton), else torch."""
    on = use_triton if use_triton is not None else scores.is_cuda
    if tail or rule.width is None or not HAS_TRITON or not on:
        method = "torch"
    if method == "torch":
        return select_pages_reference(scores, kv_lens, rule, budgets, tail, generator)
    if scores.shape[-1] > MAX_PAGES.get(method, 1 << 62):
        raise ValueError(f"select method {method!r} takes rows of at most "
                         f"{MAX_PAGES[method]} pages, not {scores.shape[-1]}")  # fmt: skip
    if method == "split":
        return select_split(scores, kv_lens, rule, budgets)
    return _select_row(scores, kv_lens, rule, budgets, method)


def _head_and_tail(M: int) -> tuple[int, int]:
    """A row of M pages as a power-of-two block and a power-of-two tail (0: none) for the
    probe kernel: no more keys than the next power of two, often far fewer (8,196 pages:
    8,192 + 16)."""
    full = triton.next_power_of_2(max(M, 16))
    if full == M or full <= 16:
        return full, 0
    head = full // 2
    return head, max(16, triton.next_power_of_2(M - head))


def _select_row(scores, kv_lens, rule: SelectRule, budgets, method: str):
    """The one-program-per-row kernels ("probe2", "hist")."""
    B, Hkv, M = scores.shape
    assert kv_lens.dtype == torch.int32 and scores.dtype == torch.float32
    width = min(rule.width, M)
    pages = torch.empty(B, Hkv, width, dtype=torch.int32, device=scores.device)
    counts = torch.empty(B, Hkv, dtype=torch.int32, device=scores.device)
    has = budgets is not None
    bud = budgets.to(torch.int32).contiguous() if has else counts
    block, tail = _head_and_tail(M)
    kernel, extra = _select_hist_kernel, {}
    if method != "hist":
        kernel, extra = _select_probe_kernel, {"BITS": int(method[5:])}
    kernel[(B * Hkv,)](
        scores, kv_lens, bud, pages, counts, min(rule.budget, M),
        scores.stride(0), scores.stride(1), pages.stride(0), pages.stride(1),
        HKV=Hkv, P=rule.page_size, SINKS=rule.sink_pages, WINDOW=rule.window_pages,
        WIDTH=width, WIDTH_P2=triton.next_power_of_2(width), BLOCK=block, TAIL=tail,
        HAS_BUDGETS=has, num_warps=min(32, max(4, block // 512)), **extra,
    )  # fmt: skip
    return pages, counts


def select_pages_reference(
    scores: torch.Tensor,
    kv_lens: torch.Tensor,
    rule: SelectRule,
    budgets: torch.Tensor | None = None,
    tail: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """select_pages in torch (topk and sort); the stochastic tail is only here."""
    page_size, budget, width = rule.page_size, rule.budget, rule.width
    sink_pages, window_pages = rule.sink_pages, rule.window_pages
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
    if budgets is not None:  # a row's own budget: the first of its top k (values descend)
        rank = torch.arange(k, device=scores.device)
        over = rank[None, None, :] >= budgets.to(scores.device)[:, None, None]
        top = torch.return_types.topk((top.values.masked_fill(over, float("-inf")), top.indices))
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
