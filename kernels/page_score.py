"""Page scoring for sparse attention, and top-k page selection.

Every page of every (sequence, KV head) has a summary of its keys, kept on the GPU:
`summ [N, R, D]` per layer, with the unit layout of the KV pools (unit = page * Hkv +
head). Layouts (`summary_rows`):
- R = 3, fp32: the elementwise min of the page's keys, their max, their sum (both modes);
- R = 2, "quest" only: min and max, in the keys' own dtype (exact: min and max of bf16 keys
  are bf16 values; half the bytes of fp32 for the scoring kernel to read);
- R = 1, "mean" only: the sum, fp32.

A page's score for one query row q:
- "quest": sum_d max(q_d * kmin_d, q_d * kmax_d), an upper bound on q.k over the page
  (Quest);
- "mean": q . (ksum / n), the dot product with the page's mean key.
Rows are pooled per (sequence, KV head): summed over the query heads of the GQA group,
then the max over the T query tokens (a verification's queries share one selection).

`page_scores` runs the Triton kernel (grid: (B * Hkv, page blocks)); `select_pages` turns
scores into page lists (sinks, local window, top-k, optional stochastic tail). Its top-k
without a tail runs as a Triton kernel too (one program per (sequence, KV head): a radix
select over the scores' bit patterns, four histogram passes of 8 bits, finds the k-th
largest, then one pass writes the chosen pages in ascending order), where torch.topk and a
sort took 0.14 ms at 128K, batch 8. (A first version bisected the 32 bits one by one: 32
passes, 0.11 ms at 128K and 0.44 ms at 500K, slower than torch there.)
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

    @triton.jit
    def _select_kernel(
        S, LENS, BUDGETS, OUT, CNT, M, budget,
        s_sb, s_sh, s_ob, s_oh,
        HKV: tl.constexpr, P: tl.constexpr, SINKS: tl.constexpr, WINDOW: tl.constexpr,
        WIDTH: tl.constexpr, BLOCK: tl.constexpr, HAS_BUDGETS: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        b = bh // HKV
        h = bh % HKV
        n_pages = tl.cdiv(tl.load(LENS + b), P)
        if HAS_BUDGETS:  # the row's own budget (its sequence's length)
            budget = tl.minimum(tl.load(BUDGETS + b), budget)
        k = tl.minimum(budget, n_pages)
        row = S + b * s_sb + h * s_sh
        o = tl.arange(0, BLOCK)
        # Radix select of the k-th largest key, 8 bits per pass from the top. Keys are the
        # scores' bits made order-preserving as unsigned 32-bit values; the sinks and the
        # window get the largest key, so they are always chosen. After each pass `prefix`
        # holds the top digits of the k-th largest key and `want` how many keys that share
        # those digits are still to be taken.
        bins = tl.arange(0, 512)  # 256 digits; bin 256 collects the keys out of the race
        prefix = tl.zeros([], tl.int64)
        want = k
        for shift in tl.static_range(24, -8, -8):
            hist = tl.zeros([512], tl.int32)
            for start in range(0, M, BLOCK):
                p = start + o
                key = _sort_key(row, p, n_pages, SINKS, WINDOW)
                racing = (p < n_pages) & ((key >> (shift + 8)) == prefix)
                hist += tl.histogram(tl.where(racing, (key >> shift) & 255, 256).to(tl.int32), 512)
            hist = tl.where(bins < 256, hist, 0)
            at_least = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # keys with digit >= bin
            digit = tl.max(tl.where((at_least >= want) & (bins < 256), bins, 0), 0)
            want -= tl.sum(tl.where(bins == digit, at_least - hist, 0), 0)
            prefix = prefix * 256 + digit
        t = prefix
        # every key above t is chosen, and `want` of the keys equal to t: the lowest pages
        ties_wanted = want
        written = tl.zeros([], tl.int32)
        ties = tl.zeros([], tl.int32)
        for start in range(0, M, BLOCK):
            p = start + o
            valid = p < n_pages
            key = _sort_key(row, p, n_pages, SINKS, WINDOW)
            tie = (key == t) & valid
            tie_rank = ties + tl.cumsum(tie.to(tl.int32), 0) - 1
            chosen = valid & ((key > t) | (tie & (tie_rank < ties_wanted)))
            pos = written + tl.cumsum(chosen.to(tl.int32), 0) - 1
            tl.store(OUT + b * s_ob + h * s_oh + pos, p, mask=chosen & (pos < WIDTH))
            written += tl.sum(chosen.to(tl.int32), 0)
            ties += tl.sum(tie.to(tl.int32), 0)
        tl.store(CNT + bh, written)
        for start in range(0, WIDTH, BLOCK):
            w = start + o
            tl.store(OUT + b * s_ob + h * s_oh + w, tl.zeros([BLOCK], tl.int32),
                     mask=(w >= written) & (w < WIDTH))  # fmt: skip

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
    def _select_bisect_kernel(
        S, LENS, BUDGETS, OUT, CNT, budget,
        s_sb, s_sh, s_ob, s_oh,
        HKV: tl.constexpr, P: tl.constexpr, SINKS: tl.constexpr, WINDOW: tl.constexpr,
        WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr, BLOCK: tl.constexpr,
        HAS_BUDGETS: tl.constexpr,
    ):  # fmt: skip
        """The same selection with the whole row in registers (BLOCK >= the row's pages):
        the k-th largest key by bisection over the 32-bit key space, each probe one count
        (a block reduction, no atomics: the histogram passes of _select_kernel serialise
        when the scores share their top bits, as scores of one magnitude do)."""
        bh, b, h, n_pages, k = _row_start(LENS, BUDGETS, budget, HKV, P, HAS_BUDGETS)
        p = tl.arange(0, BLOCK)
        valid = p < n_pages
        key = tl.where(valid, _sort_key(S + b * s_sb + h * s_sh, p, n_pages, SINKS, WINDOW), -1)
        # invariant: at least k keys >= lo, fewer than k keys >= hi
        lo = tl.zeros([], tl.int64)
        hi = tl.full([], 4294967296, tl.int64)
        for _ in tl.static_range(32):
            mid = (lo + hi) // 2
            enough = tl.sum((key >= mid).to(tl.int32), 0) >= k
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid)
        above = valid & (key > lo)
        tie = valid & (key == lo)
        ties_wanted = k - tl.sum(above.to(tl.int32), 0)
        chosen = above | (tie & (tl.cumsum(tie.to(tl.int32), 0) - 1 < ties_wanted))
        pos = tl.cumsum(chosen.to(tl.int32), 0) - 1
        out = OUT + b * s_ob + h * s_oh
        tl.store(out + pos, p, mask=chosen & (pos < WIDTH))
        written = tl.sum(chosen.to(tl.int32), 0)
        tl.store(CNT + bh, written)
        w = tl.arange(0, WIDTH_P2)
        tl.store(out + w, tl.zeros([WIDTH_P2], tl.int32), mask=(w >= written) & (w < WIDTH))

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

    @triton.jit
    def _sort_key(row, p, n_pages, SINKS: tl.constexpr, WINDOW: tl.constexpr):
        x = tl.load(row + p, mask=p < n_pages, other=0.0)
        bits = x.to(tl.int32, bitcast=True)
        key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2147483648
        forced = (p < SINKS) | (p >= n_pages - WINDOW)
        return tl.where(forced, 4294967295, key)  # unsigned order in [0, 2^32)


if HAS_TRITON:

    @triton.jit
    def _recall_kernel(
        EXACT, VALID, PRED, PRED_COUNTS, MARK, ACC, BY_LAYER, W1, W2, n_pages,
        c_hits, c_total, layer, CHUNK: tl.constexpr,
    ):  # fmt: skip
        # one (sequence, KV head) row: mark its predicted pages in its row of MARK, test its
        # exact pages against the marks, then clear them (MARK is zeros between calls):
        # O(W1 + W2), not O(W1 * W2) (that took 199 us per layer at 500K on the H200)
        row = tl.program_id(0)
        mark = MARK + row.to(tl.int64) * n_pages
        n_pred = tl.load(PRED_COUNTS + row)
        for c in range(0, W2, CHUNK):
            j = c + tl.arange(0, CHUNK)
            p = tl.load(PRED + row * W2 + j, mask=j < n_pred, other=-1)
            tl.store(mark + p, tl.full([CHUNK], 1, tl.int8), mask=(p >= 0) & (p < n_pages))
        tl.debug_barrier()  # the row's marks are all written (one program: one CTA)
        hits = tl.zeros([], tl.int64)
        total = tl.zeros([], tl.int64)
        for c in range(0, W1, CHUNK):
            i = c + tl.arange(0, CHUNK)
            valid = tl.load(VALID + row * W1 + i, mask=i < W1, other=0) != 0
            e = tl.load(EXACT + row * W1 + i, mask=valid, other=0)
            inside = valid & (e >= 0) & (e < n_pages)  # (a page outside: never predicted)
            listed = tl.load(mark + e, mask=inside, other=0) != 0
            hits += tl.sum((inside & listed).to(tl.int64), 0)
            total += tl.sum(valid.to(tl.int64), 0)
        tl.debug_barrier()  # every test has read its mark
        for c in range(0, W2, CHUNK):
            j = c + tl.arange(0, CHUNK)
            p = tl.load(PRED + row * W2 + j, mask=j < n_pred, other=-1)
            tl.store(mark + p, tl.zeros([CHUNK], tl.int8), mask=(p >= 0) & (p < n_pages))
        tl.atomic_add(ACC + c_hits, hits)
        tl.atomic_add(ACC + c_total, total)
        tl.atomic_add(BY_LAYER + 2 * layer, hits)
        tl.atomic_add(BY_LAYER + 2 * layer + 1, total)


def count_recall(exact: torch.Tensor, valid: torch.Tensor, pred: torch.Tensor,
                 pred_counts: torch.Tensor, n_pages: int, acc: torch.Tensor, c_hits: int,
                 c_total: int, by_layer: torch.Tensor, layer: int,
                 mark: torch.Tensor | None = None, use_triton: bool | None = None) -> None:  # fmt: skip
    """Recall@k of a predicted selection: exact pages [B, Hkv, W1] in [0, n_pages) (valid
    [B, Hkv, W1] bool), predicted pages [B, Hkv, W2] (the first pred_counts [B, Hkv] of each
    row); adds the exact pages the prediction listed and the exact pages to acc[c_hits],
    acc[c_total] and to by_layer[layer] (int64 counters). `mark`: int8 zeros of at least
    B * Hkv * n_pages entries, the kernel's scratch (zeros again after it; None: new)."""
    B, Hkv, W1 = exact.shape
    W2 = pred.shape[-1]
    if not (HAS_TRITON and (use_triton if use_triton is not None else exact.is_cuda)):
        listed = torch.arange(W2, device=pred.device) < pred_counts[..., None]
        same = (exact[..., :, None] == pred[..., None, :]) & listed[..., None, :]
        hits, total = (same.any(-1) & valid).sum(), valid.sum()
        acc[c_hits] += hits
        acc[c_total] += total
        by_layer[layer, 0] += hits
        by_layer[layer, 1] += total
        return
    if mark is None:
        mark = torch.zeros(B * Hkv * n_pages, dtype=torch.int8, device=exact.device)
    assert mark.numel() >= B * Hkv * n_pages and mark.dtype == torch.int8
    _recall_kernel[(B * Hkv,)](
        exact.contiguous(), valid.contiguous().view(torch.uint8), pred.contiguous(),
        pred_counts.to(torch.int32).contiguous(), mark, acc, by_layer, W1, W2, n_pages,
        c_hits, c_total, layer, CHUNK=256,
    )  # fmt: skip


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
    per_query: bool = False,
) -> torch.Tensor:
    """q [B, T, Hq, D]; summ [pages * Hkv, R, D] (a `summary_rows` layout that holds
    `mode`'s rows); block_tables [B, M] int32 (the
    sequences' page ids); kv_lens [B] int32. Returns scores [B, Hkv, M] fp32 (the max over
    the T queries), -inf past each sequence's pages. `per_query`: scores [B, T, Hkv, M],
    query t's own (it sits at position kv_len - T + t: -inf past its pages), for a
    verification's per-query selections; the summaries are read once for all T. `block`:
    pages per program where not autotuned (32 was fastest on the H200 at 128K, batch 8:
    0.14 ms against 0.38 ms with 16 and 0.18 ms with 64)."""
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
            return ref(q, summ, block_tables, kv_lens, page_size, kv_heads, mode)
        return torch.stack([ref(q[:, t : t + 1], summ, block_tables, kv_lens - (T - 1 - t),
                                page_size, kv_heads, mode) for t in range(T)], 1)  # fmt: skip
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
    `mode`: the rows to keep (see `summary_rows`); `dtype` (quest only): the keys' dtype."""
    n_rows = {None: 3, "quest": 2, "mean": 1}[mode]
    if mode != "quest":
        dtype = torch.float32
    summ = torch.empty(num_units, n_rows, head_dim, device=device, dtype=dtype)
    reset_summaries(summ, torch.arange(num_units, device=device))
    return summ


def reset_summaries(summ: torch.Tensor, units: torch.Tensor) -> None:
    rows = summary_rows({3: None, 2: "quest", 1: "mean"}[summ.shape[1]])
    if rows["min"] >= 0:
        summ[units, rows["min"]] = float("inf")
        summ[units, rows["max"]] = float("-inf")
    if rows["sum"] >= 0:
        summ[units, rows["sum"]] = 0.0


def page_scores_reference(
    q, summ, block_tables, kv_lens, page_size: int, kv_heads: int, mode: str = "quest"
):
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
    use_triton: bool | None = None,
    budgets: torch.Tensor | None = None,
    method: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick each (sequence, head)'s pages: the sinks (first pages), the local window (last
    pages), then the top-scoring others up to `budget` pages in all, plus `tail` more drawn
    at random in proportion to exp(score) from the rest (vAttention-style). Returns
    (pages [B, Hkv, K] int32 in ascending order, counts [B, Hkv] int32); entries past a
    count are 0. `width` fixes K (at least budget + tail) so nothing waits for the host and
    the call can be captured in a CUDA graph; by default K is the largest count. Without a
    tail and with `width` set, on a GPU, up to 16K pages, the Triton kernel runs (ties:
    lowest pages first). `budgets` [B] int (optional, each at most `budget`): each
    sequence's own budget (from its own length: a sequence selects the same pages whatever
    else is in its batch, and each query of a verification as if decoded alone).
    `method`: "radix", "bisect", "probe1"/"probe2"/"probe4", "hist" or "split" (each row over
    programs of SPLIT_CHUNK pages: a row's select on one SM took 137 us at 500K) (the Triton kernels; same
    output, ties to the lowest pages) or "torch"; None on a GPU: the fastest for this shape,
    timed once per shape outside CUDA-graph capture (their speeds depend on the scores'
    spread and the row count, so no fixed rule holds: docs/benchmarks.md)."""
    on = use_triton if use_triton is not None else scores.is_cuda
    if tail or width is None or not HAS_TRITON or not on:
        method = "torch"
    elif method is None:
        method = _fastest_method(scores, kv_lens, page_size, budget, sink_pages, window_pages,
                                 width, budgets)  # fmt: skip
    if method == "torch":
        return select_pages_reference(scores, kv_lens, page_size, budget, sink_pages,
                                      window_pages, tail, generator, width, budgets)  # fmt: skip
    if scores.shape[-1] > _MAX_PAGES.get(method, 1 << 62):
        raise ValueError(f"select method {method!r} takes rows of at most "
                         f"{_MAX_PAGES[method]} pages, not {scores.shape[-1]}")  # fmt: skip
    return _select_triton(scores, kv_lens, page_size, budget, sink_pages, window_pages, width,
                          budgets, method)  # fmt: skip


_METHODS: dict[tuple, str] = {}  # (rows, pages, budget, width) -> the fastest select method
_METHOD_TIMES: dict[tuple, dict] = {}  # the same keys -> each method's best time (ms, 5 calls)
SPLIT_CHUNK = 1024  # pages per program of the "split" select
# the kernels that hold a whole row in registers: the longest row each takes
_MAX_PAGES = {"bisect": 16384, "probe1": 32768, "probe2": 32768, "probe4": 32768, "hist": 32768}


def _fastest_method(scores, kv_lens, page_size, budget, sink_pages, window_pages, width,
                    budgets=None) -> str:  # fmt: skip
    B, Hkv, M = scores.shape
    key = (B * Hkv, M, budget, width)
    if key in _METHODS:
        return _METHODS[key]
    candidates = ["torch"] + [m for m, most in _MAX_PAGES.items() if most >= M]
    candidates += ["radix"] if M > 16384 else []  # (below, never the fastest: select_bench)
    candidates += ["split"]
    if not scores.is_cuda or torch.cuda.is_current_stream_capturing():
        return "radix" if M <= 16384 else "torch"
    args = (scores, kv_lens, page_size, budget, sink_pages, window_pages)
    built = []
    for m in candidates:
        try:
            select_pages(*args, width=width, method=m, budgets=budgets)  # compile
        except Exception:  # noqa: BLE001 (a kernel this GPU or Triton cannot build: skip it)
            continue
        built.append(m)
    # each method's best of three interleaved rounds: one round's noise (other work on the
    # GPU at the first call) once picked the bisection at 1.6x the probe kernel's time.
    # Timed in CUDA graphs, as decode steps run them: eagerly, the split select's 7
    # launches would be timed at Python's launch rate, not the GPU's
    graphs = {m: graph_of(lambda m=m: select_pages(*args, width=width, method=m,
                                                   budgets=budgets), reps=5)
              for m in built}  # fmt: skip
    times = dict.fromkeys(built, float("inf"))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        for m in built:
            start.record()
            if graphs[m] is not None:
                graphs[m].replay()
            else:
                for _ in range(5):
                    select_pages(*args, width=width, method=m, budgets=budgets)
            end.record()
            end.synchronize()
            times[m] = min(times[m], start.elapsed_time(end))
    _METHOD_TIMES[key] = times
    _METHODS[key] = min(times, key=times.get)
    return _METHODS[key]


def graph_of(fn, reps: int = 1):
    """`reps` calls of fn captured in one CUDA graph (to replay), or None where capture
    fails (a torch op that syncs, say)."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        return graph
    except RuntimeError:
        return None


def _head_and_tail(M: int) -> tuple[int, int]:
    """A row of M pages as a power-of-two block and a power-of-two tail (0: none) for the
    probe kernel: no more keys than the next power of two, often far fewer (8,196 pages:
    8,192 + 16)."""
    full = triton.next_power_of_2(max(M, 16))
    if full == M or full <= 16:
        return full, 0
    head = full // 2
    return head, max(16, triton.next_power_of_2(M - head))


def _select_triton(scores, kv_lens, page_size, budget, sink_pages, window_pages, width,
                   budgets=None, method: str = "radix"):  # fmt: skip
    B, Hkv, M = scores.shape
    assert kv_lens.dtype == torch.int32 and scores.dtype == torch.float32
    width = min(width, M)
    pages = torch.empty(B, Hkv, width, dtype=torch.int32, device=scores.device)
    counts = torch.empty(B, Hkv, dtype=torch.int32, device=scores.device)
    has = budgets is not None
    bud = budgets.to(torch.int32).contiguous() if has else counts
    if method == "split":
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
    if method.startswith("probe") or method == "hist":
        block, tail = _head_and_tail(M)
        kernel, extra = _select_hist_kernel, {}
        if method != "hist":
            kernel, extra = _select_probe_kernel, {"BITS": int(method[5:])}
        kernel[(B * Hkv,)](
            scores, kv_lens, bud, pages, counts, min(budget, M),
            scores.stride(0), scores.stride(1), pages.stride(0), pages.stride(1),
            HKV=Hkv, P=page_size, SINKS=sink_pages, WINDOW=window_pages, WIDTH=width,
            WIDTH_P2=triton.next_power_of_2(width), BLOCK=block, TAIL=tail, HAS_BUDGETS=has,
            num_warps=min(32, max(4, block // 512)), **extra,
        )  # fmt: skip
        return pages, counts
    if method == "bisect":
        block = triton.next_power_of_2(max(M, 16))
        _select_bisect_kernel[(B * Hkv,)](
            scores, kv_lens, bud, pages, counts, min(budget, M),
            scores.stride(0), scores.stride(1), pages.stride(0), pages.stride(1),
            HKV=Hkv, P=page_size, SINKS=sink_pages, WINDOW=window_pages, WIDTH=width,
            WIDTH_P2=triton.next_power_of_2(width), BLOCK=block, HAS_BUDGETS=has,
            num_warps=16 if block >= 8192 else 8 if block >= 2048 else 4,
        )  # fmt: skip
        return pages, counts
    block = min(4096, triton.next_power_of_2(max(M, width, 16)))
    _select_kernel[(B * Hkv,)](
        scores, kv_lens, bud, pages, counts, M, min(budget, M),
        scores.stride(0), scores.stride(1), pages.stride(0), pages.stride(1),
        HKV=Hkv, P=page_size, SINKS=sink_pages, WINDOW=window_pages, WIDTH=width, BLOCK=block,
        HAS_BUDGETS=has,
    )  # fmt: skip
    return pages, counts


def select_pages_reference(
    scores: torch.Tensor,
    kv_lens: torch.Tensor,
    page_size: int,
    budget: int,
    sink_pages: int = 1,
    window_pages: int = 2,
    tail: int = 0,
    generator: torch.Generator | None = None,
    width: int | None = None,
    budgets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """select_pages in torch (topk and sort); the stochastic tail is only here."""
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
