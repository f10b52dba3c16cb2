"""The "split" top-k select (kernels.page_topk): each row over programs of SPLIT_CHUNK
pages, for rows too long for one program to be fast (a row's select on one SM took 137 us
at 500K): 4 byte-wide histogram rounds into one global histogram per row, then a count and
a write pass."""

from __future__ import annotations

import torch

from kernels import HAS_TRITON
from kernels.views import SelectRule

SPLIT_CHUNK = 1024  # pages per program

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _probe_keys(row, p, n_pages, SINKS: tl.constexpr, WINDOW: tl.constexpr):
        """Signed int32 keys in the scores' order at pages p (the sinks and the window: the
        largest; past the row: the smallest); u = key + 2^31 is the same order unsigned."""
        valid = p < n_pages
        x = tl.load(row + p, mask=valid, other=0.0)
        bits = x.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        forced = (p < SINKS) | (p >= n_pages - WINDOW)
        key = tl.where(forced, 2147483647, key)
        return tl.where(valid, key, -2147483648)

    @triton.jit
    def _split_threshold(HIST, k, ROUNDS: tl.constexpr):
        """The k-th largest unsigned key's leading ROUNDS bytes (`prefix`) and how many keys
        lie above them (`n_greater`), from a row's global histograms of rounds 0..ROUNDS-1
        (the hist kernel's rule, with the histograms of every chunk added up)."""
        bins = tl.arange(0, 256)
        n_greater = tl.zeros([], tl.int32)
        prefix = tl.zeros([], tl.uint32)
        for r in tl.static_range(ROUNDS):
            hist = tl.load(HIST + r * 256 + bins)
            at_least = n_greater + tl.cumsum(hist, 0, reverse=True)
            best = tl.max(tl.where(at_least >= k, bins, 0), 0)
            n_greater += tl.sum(tl.where(bins > best, hist, 0), 0)
            prefix = (prefix << 8) | best.to(tl.uint32)
        return prefix, n_greater

    @triton.jit
    def _split_chunk(S, LENS, BUDGETS, budget, s_sb, s_sh, HKV: tl.constexpr, P: tl.constexpr,
                     SINKS: tl.constexpr, WINDOW: tl.constexpr, CHUNK: tl.constexpr,
                     HAS_BUDGETS: tl.constexpr):  # fmt: skip
        """A split-select program's chunk: (row, sequence, KV head, k, pages, their valid
        mask, their unsigned keys). Grid: (chunks, rows)."""
        bh = tl.program_id(1)
        b = bh // HKV
        h = bh % HKV
        n_pages = tl.cdiv(tl.load(LENS + b), P)
        if HAS_BUDGETS:
            budget = tl.minimum(tl.load(BUDGETS + b), budget)
        p = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
        key = _probe_keys(S + b * s_sb + h * s_sh, p, n_pages, SINKS, WINDOW)
        u = key.to(tl.uint32, bitcast=True) ^ 0x80000000
        return bh, b, h, tl.minimum(budget, n_pages), p, p < n_pages, u

    @triton.jit
    def _split_hist_kernel(
        S, LENS, BUDGETS, HIST, budget, s_sb, s_sh,
        HKV: tl.constexpr, P: tl.constexpr, SINKS: tl.constexpr, WINDOW: tl.constexpr,
        CHUNK: tl.constexpr, HAS_BUDGETS: tl.constexpr, ROUND: tl.constexpr,
    ):  # fmt: skip
        """Round ROUND of the split select: this chunk's 256-bin histogram of byte ROUND of
        the keys whose higher bytes equal the threshold's so far (every program derives it
        from the earlier rounds' global histograms), added into the row's HIST[ROUND]."""
        bh, b, h, k, p, valid, u = _split_chunk(S, LENS, BUDGETS, budget, s_sb, s_sh, HKV, P,
                                                SINKS, WINDOW, CHUNK, HAS_BUDGETS)  # fmt: skip
        row_hist = HIST + bh * 1024
        byte = ((u >> (24 - 8 * ROUND)) & 255).to(tl.int32)
        if ROUND == 0:
            hist = tl.histogram(byte, 256, mask=valid)
        else:
            prefix, n_greater = _split_threshold(row_hist, k, ROUND)
            hist = tl.histogram(byte, 256, mask=valid & ((u >> (32 - 8 * ROUND)) == prefix))
        bins = tl.arange(0, 256)
        tl.atomic_add(row_hist + ROUND * 256 + bins, hist, mask=hist > 0)

    @triton.jit
    def _split_count_kernel(
        S, LENS, BUDGETS, HIST, COUNTS, budget, s_sb, s_sh,
        HKV: tl.constexpr, P: tl.constexpr, SINKS: tl.constexpr, WINDOW: tl.constexpr,
        CHUNK: tl.constexpr, HAS_BUDGETS: tl.constexpr,
    ):  # fmt: skip
        """Per chunk of a row: its keys above the k-th largest (COUNTS[row, 0, chunk]) and
        equal to it (COUNTS[row, 1, chunk])."""
        bh, b, h, k, p, valid, u = _split_chunk(S, LENS, BUDGETS, budget, s_sb, s_sh, HKV, P,
                                                SINKS, WINDOW, CHUNK, HAS_BUDGETS)  # fmt: skip
        t, n_greater = _split_threshold(HIST + bh * 1024, k, 4)
        c, nc = tl.program_id(0), tl.num_programs(0)
        tl.store(COUNTS + (bh * 2) * nc + c, tl.sum((valid & (u > t)).to(tl.int32), 0))
        tl.store(COUNTS + (bh * 2 + 1) * nc + c, tl.sum((valid & (u == t)).to(tl.int32), 0))

    @triton.jit
    def _split_write_kernel(
        S, LENS, BUDGETS, HIST, COUNTS, OUT, CNT, budget, s_sb, s_sh, s_ob, s_oh,
        HKV: tl.constexpr, P: tl.constexpr, SINKS: tl.constexpr, WINDOW: tl.constexpr,
        CHUNK: tl.constexpr, HAS_BUDGETS: tl.constexpr, NP: tl.constexpr, WIDTH: tl.constexpr,
        WIDTH_P2: tl.constexpr,
    ):  # fmt: skip
        """The row's selection in page order: every key above the k-th largest, then its
        ties from the lowest page; each chunk writes its pages after the earlier chunks'.
        The first chunk writes the count and the zeros past it, up to WIDTH."""
        bh, b, h, k, p, valid, u = _split_chunk(S, LENS, BUDGETS, budget, s_sb, s_sh, HKV, P,
                                                SINKS, WINDOW, CHUNK, HAS_BUDGETS)  # fmt: skip
        t, n_greater = _split_threshold(HIST + bh * 1024, k, 4)
        ties_wanted = k - n_greater
        c, nc = tl.program_id(0), tl.num_programs(0)
        j = tl.arange(0, NP)
        above = tl.load(COUNTS + (bh * 2) * nc + j, mask=j < nc, other=0)
        ties = tl.load(COUNTS + (bh * 2 + 1) * nc + j, mask=j < nc, other=0)
        ties_before = tl.cumsum(ties, 0) - ties
        taken = above + tl.minimum(tl.maximum(ties_wanted - ties_before, 0), ties)
        base = tl.sum(tl.where(j < c, taken, 0), 0)
        tie_base = tl.sum(tl.where(j < c, ties, 0), 0)
        tie = valid & (u == t)
        tie_rank = tie_base + tl.cumsum(tie.to(tl.int32), 0) - 1
        chosen = (valid & (u > t)) | (tie & (tie_rank < ties_wanted))
        pos = base + tl.cumsum(chosen.to(tl.int32), 0) - 1
        out = OUT + b * s_ob + h * s_oh
        tl.store(out + pos, p, mask=chosen & (pos < WIDTH))
        if c == 0:
            written = tl.sum(taken, 0)
            tl.store(CNT + bh, written)
            w = tl.arange(0, WIDTH_P2)
            tl.store(out + w, tl.zeros([WIDTH_P2], tl.int32), mask=(w >= written) & (w < WIDTH))


def select_split(
    scores: torch.Tensor,
    kv_lens: torch.Tensor,
    rule: SelectRule,
    budgets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """select_pages by the split kernels (same arguments and output)."""
    B, Hkv, M = scores.shape
    assert kv_lens.dtype == torch.int32 and scores.dtype == torch.float32
    width, budget, page_size = min(rule.width, M), rule.budget, rule.page_size
    sink_pages, window_pages = rule.sink_pages, rule.window_pages
    pages = torch.empty(B, Hkv, width, dtype=torch.int32, device=scores.device)
    counts = torch.empty(B, Hkv, dtype=torch.int32, device=scores.device)
    has = budgets is not None
    bud = budgets.to(torch.int32).contiguous() if has else counts
    nc = triton.cdiv(M, SPLIT_CHUNK)
    rows = B * Hkv
    hist = torch.zeros(rows, 4, 256, dtype=torch.int32, device=scores.device)
    part = torch.empty(rows, 2, nc, dtype=torch.int32, device=scores.device)
    args = (scores, kv_lens, bud)
    common = dict(HKV=Hkv, P=page_size, SINKS=sink_pages, WINDOW=window_pages,
                  CHUNK=SPLIT_CHUNK, HAS_BUDGETS=has)  # fmt: skip
    strides = (scores.stride(0), scores.stride(1))
    for r in range(4):
        _split_hist_kernel[(nc, rows)](*args, hist, min(budget, M), *strides, ROUND=r,
                                       **common)  # fmt: skip
    _split_count_kernel[(nc, rows)](*args, hist, part, min(budget, M), *strides, **common)
    _split_write_kernel[(nc, rows)](
        *args, hist, part, pages, counts, min(budget, M), *strides, pages.stride(0),
        pages.stride(1), NP=max(16, triton.next_power_of_2(nc)), WIDTH=width,
        WIDTH_P2=triton.next_power_of_2(width), **common,
    )  # fmt: skip
    return pages, counts
