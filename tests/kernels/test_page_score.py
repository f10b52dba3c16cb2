"""Page scoring (Triton against the torch reference; the Quest score bounds q.k) and page
selection (sinks, window, top-k, stochastic tail)."""

from __future__ import annotations

import pytest
import torch

from kernels import HAS_TRITON, INTERPRET
from kernels.page_score import (
    empty_summaries,
    page_scores,
    page_scores_reference,
    select_pages,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not (HAS_TRITON and (INTERPRET or torch.cuda.is_available())), reason="needs triton"
)


def build(group, head_dim, T, seed, lens=(5, 40, 130), P=16, Hkv=2):
    """Keys in a shuffled page pool, their exact summaries, queries, block tables."""
    g = torch.Generator().manual_seed(seed)
    n_pages = [-(-n // P) for n in lens]
    total = sum(n_pages) + 2
    keys = torch.randn(total, Hkv, P, head_dim, generator=g)
    order = torch.randperm(total, generator=g)
    tables = torch.zeros(len(lens), max(n_pages), dtype=torch.int32)
    summ = empty_summaries(total * Hkv, head_dim)
    used = 0
    for b, (n, np_) in enumerate(zip(lens, n_pages, strict=True)):
        tables[b, :np_] = order[used : used + np_]
        used += np_
        for p in range(np_):
            rows = min(P, n - p * P)
            page = int(tables[b, p])
            for h in range(Hkv):
                k = keys[page, h, :rows]
                summ[page * Hkv + h] = torch.stack([k.amin(0), k.amax(0), k.sum(0)])
    q = torch.randn(len(lens), T, Hkv * group, head_dim, generator=g)
    return q, summ, tables, torch.tensor(lens, dtype=torch.int32), keys


@needs_triton
@pytest.mark.parametrize("mode", ["quest", "mean"])
@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_kernel_matches_reference(mode, T, group, head_dim):
    q, summ, tables, lens, _ = build(group, head_dim, T, seed=group + head_dim + T)
    args = [t.to(DEVICE) for t in (q, summ, tables, lens)]
    out = page_scores(*args, 16, 2, mode=mode, block=16, use_triton=True)
    ref = page_scores_reference(*args, 16, 2, mode)
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(out))
    tol = 1e-2 if DEVICE == "cuda" else 1e-3  # TF32 on the GPU: scores only rank pages
    assert torch.allclose(out[finite].cpu(), ref[finite].cpu(), rtol=tol, atol=tol)


def test_quest_score_bounds_the_best_key_and_mean_is_the_mean():
    group, P, Hkv, D = 3, 16, 2, 64
    q, summ, tables, lens, keys = build(group, D, 1, seed=5)
    quest = page_scores_reference(q, summ, tables, lens, P, Hkv, "quest")
    mean = page_scores_reference(q, summ, tables, lens, P, Hkv, "mean")
    for b, n in enumerate(lens.tolist()):
        for p in range(-(-n // P)):
            rows = min(P, n - p * P)
            page = int(tables[b, p])
            for h in range(Hkv):
                k = keys[page, h, :rows]
                qg = q[b, 0, h * group : (h + 1) * group]  # [G, D]
                best = (qg @ k.T).sum(0).max()  # the pooled score of the best key
                assert quest[b, h, p] >= best - 1e-4
                assert torch.allclose(mean[b, h, p], (qg @ k.mean(0)).sum(), atol=1e-4)


def test_selection_keeps_sinks_window_and_top_scores():
    scores = torch.tensor([[[0.0, 9.0, 1.0, 8.0, 2.0, 3.0, 0.5, 0.1]]])
    lens = torch.tensor([8 * 16 - 3], dtype=torch.int32)  # 8 pages, the last partial
    pages, counts = select_pages(scores, lens, 16, budget=5, sink_pages=1, window_pages=2)
    assert counts.tolist() == [[5]]
    assert pages[0, 0, :5].tolist() == [0, 1, 3, 6, 7]  # sink 0, window 6-7, top 1 and 3
    # a budget over the page count takes every page; short sequences are capped
    lens2 = torch.tensor([3 * 16], dtype=torch.int32)
    pages, counts = select_pages(scores, lens2, 16, budget=50)
    assert counts.tolist() == [[3]] and pages[0, 0].tolist() == [0, 1, 2]


def test_stochastic_tail_adds_distinct_unselected_pages():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 40, generator=g)
    lens = torch.tensor([40 * 16, 25 * 16], dtype=torch.int32)
    base, base_counts = select_pages(scores, lens, 16, budget=6)
    more, counts = select_pages(scores, lens, 16, budget=6, tail=4, generator=g)
    assert (counts == base_counts + 4).all()
    for b in range(2):
        for h in range(3):
            got = more[b, h, : counts[b, h]].tolist()
            assert got == sorted(set(got)) and set(base[b, h, :6].tolist()) <= set(got)
            assert max(got) < lens[b] // 16


@needs_triton
@pytest.mark.parametrize(
    "method", ["radix", "bisect", "probe1", "probe2", "probe4", "hist", "split"]
)
@pytest.mark.parametrize("M, budget, width", [(40, 6, 6), (300, 17, 20), (5000, 100, 100)])
def test_select_kernel_matches_reference(M, budget, width, method):
    """Triton top-k selection (radix histograms, or bisection with the row in registers, one
    bit or several per round) against topk + sort: several
    lengths per batch (one shorter than the budget, one of a single page), negative and
    positive scores, -inf past the pages as page_scores leaves them."""
    g = torch.Generator().manual_seed(M)
    B, Hkv, P = 4, 3, 16
    lens = torch.tensor([M * P, (M // 2) * P - 5, 4 * P, 1], dtype=torch.int32)
    scores = torch.randn(B, Hkv, M, generator=g) * 10
    n_pages = (lens + P - 1) // P
    scores[torch.arange(M)[None, None, :] >= n_pages[:, None, None].expand(B, Hkv, M)] = -1e30
    scores = scores.masked_fill(scores == -1e30, float("-inf"))
    args = (scores.to(DEVICE), lens.to(DEVICE), P, budget)
    got, got_n = select_pages(*args, width=width, use_triton=True, method=method)
    ref, ref_n = select_pages(*args, width=width, use_triton=False)
    assert torch.equal(got_n.cpu(), ref_n.cpu()) and torch.equal(got.cpu(), ref.cpu())
    # a budget per sequence (its own length's), at most the step's
    budgets = torch.tensor([budget, budget - 2, 5, budget], dtype=torch.int32).to(DEVICE)
    got, got_n = select_pages(*args, width=width, use_triton=True, method=method, budgets=budgets)
    ref, ref_n = select_pages(*args, width=width, use_triton=False, budgets=budgets)
    assert torch.equal(got_n.cpu(), ref_n.cpu()) and torch.equal(got.cpu(), ref.cpu())
    assert got_n[2].max() <= 5 and got_n[1].max() == min(budget - 2, int(n_pages[1]))


@needs_triton
@pytest.mark.parametrize(
    "method", ["radix", "bisect", "probe1", "probe2", "probe4", "hist", "split"]
)
def test_select_kernel_breaks_ties_by_lowest_page(method):
    scores = torch.zeros(1, 2, 30)
    scores[0, 1, 20] = 1.0
    lens = torch.tensor([30 * 16], dtype=torch.int32)
    pages, counts = select_pages(scores.to(DEVICE), lens.to(DEVICE), 16, 6, width=8,
                                 use_triton=True, method=method)  # fmt: skip
    assert counts.tolist() == [[6, 6]]
    assert pages[0, 0].tolist() == [0, 1, 2, 3, 28, 29, 0, 0]  # sink, 3 lowest ties, window
    assert pages[0, 1].tolist() == [0, 1, 2, 20, 28, 29, 0, 0]


@needs_triton
@pytest.mark.parametrize("method", ["probe1", "probe2", "hist"])
def test_probe_ties_run_across_the_row_tail(method):
    """A row of 40 pages is a block of 32 and a tail of 16 in the probe kernel: tied pages
    are taken lowest first across the two."""
    scores = torch.zeros(1, 1, 40)
    scores[0, 0, 5] = 1.0
    lens = torch.tensor([40 * 16], dtype=torch.int32)
    pages, counts = select_pages(scores.to(DEVICE), lens.to(DEVICE), 16, 37, width=38,
                                 use_triton=True, method=method)  # fmt: skip
    want = [0, 5] + [p for p in range(1, 40) if p != 5][:33] + [38, 39]
    assert counts.tolist() == [[37]]
    assert pages[0, 0].tolist() == sorted(want) + [0]


@needs_triton
@pytest.mark.parametrize("chunk", [16, 64])
def test_split_select_runs_ties_and_budgets_across_chunks(chunk, monkeypatch):
    """The split select with small chunks, so that a row spans many programs: ties taken
    lowest first across chunk boundaries, rows of other lengths and budgets in the batch,
    the same pages as the reference."""
    from kernels import page_score

    monkeypatch.setattr(page_score, "SPLIT_CHUNK", chunk)
    g = torch.Generator().manual_seed(chunk)
    B, Hkv, M, P = 3, 2, 300, 16
    lens = torch.tensor([M * P, 130 * P - 3, 20 * P], dtype=torch.int32)
    scores = torch.randint(0, 4, (B, Hkv, M), generator=g).float()  # many ties
    n_pages = (lens + P - 1) // P
    scores[torch.arange(M)[None, None, :] >= n_pages[:, None, None].expand(B, Hkv, M)] = float(
        "-inf"
    )
    for budget, budgets in ((40, None), (90, torch.tensor([90, 17, 90], dtype=torch.int32))):
        args = (scores.to(DEVICE), lens.to(DEVICE), P, budget)
        b = None if budgets is None else budgets.to(DEVICE)
        got, got_n = select_pages(*args, width=budget + 3, use_triton=True, method="split",
                                  budgets=b)  # fmt: skip
        # the reference's torch.topk orders ties arbitrarily: the rule (the lowest pages
        # first) checked directly
        for i in range(B):
            for h in range(Hkv):
                n = int(n_pages[i])
                k = min(budget if budgets is None else int(budgets[i]), n)
                s = scores[i, h, :n].clone()
                s[:1] = float("inf")
                s[n - 2 :] = float("inf")
                order = sorted(range(n), key=lambda p, s=s: (-float(s[p]), p))[:k]
                assert int(got_n[i, h]) == k
                row = got[i, h].cpu().tolist()
                assert row[:k] == sorted(order) and row[k:] == [0] * (budget + 3 - k)


@needs_triton
@pytest.mark.parametrize("method", ["bisect", "probe1", "probe2", "probe4", "hist", "split"])
def test_select_kernel_orders_extreme_scores(method):
    """Keys across the whole float range (huge and tiny magnitudes of both signs, zeros):
    the k-th largest key lands exactly, whatever its bits. (Distinct values: torch.topk,
    the reference, orders ties arbitrarily; ties have their own test below. Scores are
    finite within a sequence's pages, as page_scores gives them.)"""
    g = torch.Generator().manual_seed(5)
    M = 700
    mag = 10 ** (torch.rand(2, 3, M, generator=g, dtype=torch.float64) * 76 - 38)
    sign = torch.where(torch.rand(2, 3, M, generator=g) < 0.5, -1.0, 1.0)
    scores = (sign * mag).float()
    scores[0, 0, 100], scores[1, 2, 7] = 0.0, -0.0
    lens = torch.tensor([M * 16, 300 * 16], dtype=torch.int32)
    scores[1, :, 300:] = float("-inf")
    for budget in (3, 4, 40, 350, 700):
        args = (scores.to(DEVICE), lens.to(DEVICE), 16, budget)
        got = select_pages(*args, width=budget, use_triton=True, method=method)
        ref = select_pages(*args, width=budget, use_triton=False)
        assert torch.equal(got[1].cpu(), ref[1].cpu()), budget
        assert torch.equal(got[0].cpu(), ref[0].cpu()), budget


@needs_triton
@pytest.mark.parametrize("layout", ["quest-bf16", "quest-fp32", "mean"])
def test_kernel_reads_the_reduced_summary_layouts(layout):
    """The engine keeps only its mode's rows: quest's min/max in the keys' dtype, mean's sum."""
    q, summ, tables, lens, _ = build(4, 64, 1, seed=9)
    mode = layout.split("-")[0]
    if mode == "quest":
        small = summ[:, :2].to(torch.bfloat16 if layout.endswith("bf16") else torch.float32)
        full = small.float()
    else:
        small = summ[:, 2:].contiguous()
        full = summ
    args = [t.to(DEVICE) for t in (q, small.contiguous(), tables, lens)]
    out = page_scores(*args, 16, 2, mode=mode, block=16, use_triton=True)
    ref = page_scores_reference(q, torch.cat([full[:, :2], summ[:, 2:]], 1), tables, lens, 16, 2,
                                mode)  # fmt: skip
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(out.cpu()))
    tol = 1e-2 if DEVICE == "cuda" else 1e-3
    assert torch.allclose(out.cpu()[finite], ref[finite], rtol=tol, atol=tol)
    empty = empty_summaries(4, 64, mode=mode, dtype=torch.bfloat16)
    assert empty.shape[1] == (2 if mode == "quest" else 1)
    assert empty.dtype == (torch.bfloat16 if mode == "quest" else torch.float32)


@needs_triton
@pytest.mark.parametrize("mode", ["quest", "mean"])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_per_query_scores_are_each_querys_own(mode, group, head_dim):
    """A verification's T queries scored in one pass of the summaries: row t equals query t
    scored alone at its own length (kv_len - T + 1 + t; lengths 17 and 33 put queries on
    both sides of a page boundary), kernel and reference."""
    T = 4
    q, summ, tables, lens, _ = build(group, head_dim, T, seed=7 + group, lens=(17, 33, 130))
    args = [t.to(DEVICE) for t in (q, summ, tables, lens)]
    out = page_scores(*args, 16, 2, mode=mode, block=16, use_triton=True, per_query=True)
    ref = page_scores(*args, 16, 2, mode=mode, use_triton=False, per_query=True)
    assert out.shape == ref.shape == (3, T, 2, tables.shape[1])
    tol = 1e-2 if DEVICE == "cuda" else 1e-3
    for t in range(T):
        alone = page_scores_reference(args[0][:, t : t + 1], args[1], args[2],
                                      args[3] - (T - 1 - t), 16, 2, mode)  # fmt: skip
        assert torch.equal(ref[:, t], alone)
        finite = torch.isfinite(alone)
        assert torch.equal(finite, torch.isfinite(out[:, t]))
        assert torch.allclose(out[:, t][finite].cpu(), alone[finite].cpu(), rtol=tol, atol=tol)
    # a page the first query cannot see yet (length 17 - 3 = 14: one page) is -inf for it
    assert not torch.isfinite(out[0, 0, :, 1]).any() and torch.isfinite(out[0, 3, :, 1]).all()


@needs_triton
def test_recall_kernel_matches_reference():
    """count_recall: the exact pages a prediction listed, per row, into the counters (with
    invalid entries on both sides, duplicates in the prediction, unequal widths, and rows
    wider than one of the kernel's chunks); its scratch is zeros again after each call."""
    from kernels.page_score import count_recall

    g = torch.Generator().manual_seed(4)
    B, Hkv, W1, W2, M = 3, 2, 300, 280, 700
    exact = torch.stack([torch.randperm(M, generator=g)[:W1] for _ in range(B * Hkv)])
    exact = exact.view(B, Hkv, W1)
    valid = torch.rand(B, Hkv, W1, generator=g) < 0.8
    pred = torch.randint(0, M, (B, Hkv, W2), generator=g).to(torch.int32)
    pred_counts = torch.randint(W2 // 2, W2 + 1, (B, Hkv), generator=g).to(torch.int32)
    pred_counts[0, 0] = 0  # predicted nothing
    pred[1, 1] = pred[1, 1, 0]  # all one page
    mark = torch.zeros(B * Hkv * M, dtype=torch.int8, device=DEVICE)
    out = []
    for use_triton in (True, False):
        acc = torch.zeros(5, dtype=torch.long, device=DEVICE)
        by_layer = torch.zeros(4, 2, dtype=torch.long, device=DEVICE)
        for _ in range(2):  # the second call reads the scratch the first one left
            count_recall(exact.to(DEVICE), valid.to(DEVICE), pred.to(DEVICE),
                         pred_counts.to(DEVICE), M, acc, 1, 3, by_layer, 2, mark,
                         use_triton=use_triton)  # fmt: skip
        assert not mark.any()
        out.append((acc.cpu(), by_layer.cpu()))
    (acc, by_layer), (ref_acc, ref_by_layer) = out
    assert torch.equal(acc, ref_acc) and torch.equal(by_layer, ref_by_layer)
    hits = sum(bool(valid[b, h, i]) and int(exact[b, h, i]) in pred[b, h, : pred_counts[b, h]].tolist()
               for b in range(B) for h in range(Hkv) for i in range(W1))  # fmt: skip
    hits, total = 2 * hits, 2 * int(valid.sum())
    assert acc.tolist() == [0, hits, 0, total, 0] and 0 < hits < total
    assert by_layer[2].tolist() == [hits, total] and by_layer[[0, 1, 3]].sum() == 0
