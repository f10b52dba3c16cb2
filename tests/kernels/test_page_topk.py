"""Page selection (sinks, window, top-k, stochastic tail): the Triton methods against the
torch reference."""

from __future__ import annotations

import pytest
import torch

from kernels.page_topk import select_pages as select_by_rule
from kernels.views import SelectRule
from tests.triton_marks import DEVICE, needs_triton

KERNELS = ["probe2", "hist", "split"]


def select_pages(scores, lens, page_size, budget, width=None, budgets=None, **kw):
    """select_pages with the rule's fields as arguments."""
    rule = SelectRule(page_size, budget, kw.pop("sink_pages", 1), kw.pop("window_pages", 2), width)
    return select_by_rule(scores, lens, rule, budgets, **kw)


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
@pytest.mark.parametrize("method", KERNELS)
@pytest.mark.parametrize("M, budget, width", [(40, 6, 6), (300, 17, 20), (5000, 100, 100)])
def test_select_kernel_matches_reference(M, budget, width, method):
    """Triton top-k selection (the row in registers, 2 bits or a byte per round, or the row
    split over programs) against topk + sort: several
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
@pytest.mark.parametrize("method", KERNELS)
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
@pytest.mark.parametrize("method", ["probe2", "hist"])
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
    from kernels import page_topk_split

    monkeypatch.setattr(page_topk_split, "SPLIT_CHUNK", chunk)
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
@pytest.mark.parametrize("method", KERNELS)
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


def test_method_choice_without_a_gpu_is_the_probe_kernel_or_the_forced_one():
    """engine.kv.select_methods: where nothing can be timed (the CPU), the probe kernel up to
    its longest row and torch past it, none recorded as chosen; `only` overrides."""
    from engine.kv.select_methods import SelectMethods

    methods = SelectMethods()
    lens = torch.tensor([16 * 100], dtype=torch.int32)
    rule = SelectRule(16, 8, width=8)
    assert methods.method_for(torch.zeros(1, 2, 100), lens, rule) == "probe2"
    assert methods.method_for(torch.zeros(1, 1, 40000), lens, rule) == "torch"
    assert methods.chosen_methods() == {} and methods.method_times() == {}
    methods.only = "split"
    assert methods.method_for(torch.zeros(1, 2, 100), lens, rule) == "split"
