"""The union of a verification's per-query selections: the Triton kernels against the torch
reference, and the reference against a plain set union."""

from __future__ import annotations

import pytest
import torch

from kernels.page_union import union_pages, union_pages_reference
from tests.triton_marks import DEVICE, needs_triton


def selections(B, T, Hkv, M, K, seed, overlap=0.8):
    """Each query's pages (distinct, ascending, then zeros), later queries sharing most of
    query 0's; counts from K // 2 to K."""
    g = torch.Generator().manual_seed(seed)
    pages = torch.zeros(B * T, Hkv, K, dtype=torch.int32)
    counts = torch.randint(K // 2, K + 1, (B * T, Hkv), generator=g, dtype=torch.int32)
    for b in range(B):
        for h in range(Hkv):
            first = torch.randperm(M, generator=g)[:K]
            for t in range(T):
                n = int(counts[b * T + t, h])
                fresh = torch.randperm(M, generator=g)
                keep = torch.rand(K, generator=g) < (1.0 if t == 0 else overlap)
                mine = torch.where(keep, first, fresh[:K]).unique()[:n]
                counts[b * T + t, h] = len(mine)
                pages[b * T + t, h, : len(mine)] = mine.sort().values.int()
    return pages, counts


def test_reference_is_the_set_union_with_query_bits():
    B, T, Hkv, M, K = 2, 3, 2, 300, 40
    pages, counts = selections(B, T, Hkv, M, K, seed=1)
    out, n, qmask = union_pages_reference(pages, counts, T, M)
    for b in range(B):
        for h in range(Hkv):
            want = {}
            for t in range(T):
                for p in pages[b * T + t, h, : counts[b * T + t, h]].tolist():
                    want[p] = want.get(p, 0) | (1 << t)
            got = out[b, h, : n[b, h]].tolist()
            assert got == sorted(want)
            assert qmask[b, h, : n[b, h]].tolist() == [want[p] for p in got]
            assert not out[b, h, n[b, h] :].any() and not qmask[b, h, n[b, h] :].any()


@needs_triton
@pytest.mark.parametrize(
    "B, T, Hkv, M, K, width",
    [
        (1, 2, 2, 100, 16, 40),  # one chunk
        (2, 5, 3, 2500, 90, 200),
        (1, 3, 2, 9000, 150, 300),  # three chunks of 4,096 pages, a partial last one
        (1, 9, 2, 1100, 60, 64),  # narrower than most unions: cut and flagged
        (1, 5, 8, 8196, 164, 820),  # a k = 4 verification at 128K, 2% (its graph's width)
    ],
)
def test_triton_equals_reference(B, T, Hkv, M, K, width):
    pages, counts = selections(B, T, Hkv, M, K, seed=B * 100 + T)
    pages, counts = pages.to(DEVICE), counts.to(DEVICE)
    flag_ref = torch.zeros((), dtype=torch.int32, device=DEVICE)
    ref = union_pages_reference(pages, counts, T, M, width, flag_ref)
    scratch = torch.zeros(B * Hkv * M + 7, dtype=torch.int32, device=DEVICE)
    flag = torch.zeros((), dtype=torch.int32, device=DEVICE)
    for _ in range(2):  # the scratch is left clean: a second call gives the same
        got = union_pages(pages, counts, T, M, width, flag, scratch, use_triton=True)
        for a, b in zip(got, ref, strict=True):
            assert torch.equal(a.cpu(), b.cpu())
        assert not scratch.any()
    assert int(flag) == int(flag_ref)
    assert int(flag) == int(union_pages_reference(pages, counts, T, M)[1].max() > width)


@needs_triton
def test_bad_scratch_is_refused():
    pages, counts = selections(1, 2, 2, 64, 8, seed=3)
    with pytest.raises(ValueError, match="scratch"):
        union_pages(pages, counts, 2, 64, 16, scratch=torch.zeros(10, dtype=torch.int32),
                    use_triton=True)  # fmt: skip
