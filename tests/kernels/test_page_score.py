"""Page scoring (Triton against the torch reference; the Quest score bounds q.k)."""

from __future__ import annotations

import pytest
import torch

from kernels.fp8 import FP8, to_fp8
from kernels.page_score import PageSummaries, empty_summaries, page_scores, page_scores_reference
from kernels.views import PageTable
from tests.triton_marks import DEVICE, needs_triton


def scores_of(q, summ, tables, lens, P, Hkv, mode, fn=page_scores_reference, **kw):
    """page_scores (or its reference) of the raw tensors."""
    return fn(q, PageSummaries(summ, Hkv, mode), PageTable(tables, lens, P), **kw)


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
    out = scores_of(*args, 16, 2, mode, page_scores, block=16, use_triton=True)
    ref = scores_of(*args, 16, 2, mode)
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(out))
    tol = 1e-2 if DEVICE == "cuda" else 1e-3  # TF32 on the GPU: scores only rank pages
    assert torch.allclose(out[finite].cpu(), ref[finite].cpu(), rtol=tol, atol=tol)


def test_quest_score_bounds_the_best_key_and_mean_is_the_mean():
    group, P, Hkv, D = 3, 16, 2, 64
    q, summ, tables, lens, keys = build(group, D, 1, seed=5)
    quest = scores_of(q, summ, tables, lens, P, Hkv, "quest")
    mean = scores_of(q, summ, tables, lens, P, Hkv, "mean")
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


@needs_triton
@pytest.mark.parametrize("layout", ["quest-bf16", "quest-fp32", "quest-fp8", "mean"])
def test_kernel_reads_the_reduced_summary_layouts(layout):
    """The engine keeps only its mode's rows: quest's min/max in the keys' dtype (fp8 for an
    fp8 pool), mean's sum."""
    q, summ, tables, lens, _ = build(4, 64, 1, seed=9)
    mode, dtype = layout.split("-")[0], layout.split("-")[-1]
    if mode == "quest":
        cast = {"bf16": lambda t: t.to(torch.bfloat16), "fp32": lambda t: t, "fp8": to_fp8}
        small = cast[dtype](summ[:, :2] * 30)  # (fp8: some saturate at 448)
        full = small.float()
    else:
        small = summ[:, 2:].contiguous()
        full = summ
    args = [t.to(DEVICE) for t in (q, small.contiguous(), tables, lens)]
    out = scores_of(*args, 16, 2, mode, page_scores, block=16, use_triton=True)
    ref = scores_of(q, torch.cat([full[:, :2], summ[:, 2:]], 1), tables, lens, 16, 2, mode)
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(out.cpu()))
    tol = 1e-2 if DEVICE == "cuda" else 1e-3
    assert torch.allclose(out.cpu()[finite], ref[finite], rtol=tol, atol=tol)
    empty = empty_summaries(4, 64, mode=mode, dtype=torch.bfloat16)
    assert empty.shape[1] == (2 if mode == "quest" else 1)
    assert empty.dtype == (torch.bfloat16 if mode == "quest" else torch.float32)
    if layout == "quest-fp8":  # (no infinities in fp8: its extremes)
        empty = empty_summaries(4, 64, mode="quest", dtype=FP8)
        assert empty.dtype == FP8
        assert (empty[:, 0].float() == 448).all() and (empty[:, 1].float() == -448).all()


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
    out = scores_of(*args, 16, 2, mode, page_scores, block=16, use_triton=True, per_query=True)
    ref = scores_of(*args, 16, 2, mode, page_scores, use_triton=False, per_query=True)
    assert out.shape == ref.shape == (3, T, 2, tables.shape[1])
    tol = 1e-2 if DEVICE == "cuda" else 1e-3
    for t in range(T):
        alone = scores_of(args[0][:, t : t + 1], args[1], args[2], args[3] - (T - 1 - t), 16, 2,
                          mode)  # fmt: skip
        assert torch.equal(ref[:, t], alone)
        finite = torch.isfinite(alone)
        assert torch.equal(finite, torch.isfinite(out[:, t]))
        assert torch.allclose(out[:, t][finite].cpu(), alone[finite].cpu(), rtol=tol, atol=tol)
    # a page the first query cannot see yet (length 17 - 3 = 14: one page) is -inf for it
    assert not torch.isfinite(out[0, 0, :, 1]).any() and torch.isfinite(out[0, 3, :, 1]).all()
