"""The recall counter of a predicted selection (Triton against the torch reference)."""

from __future__ import annotations

import torch

from kernels.page_recall import RecallCounters, count_recall
from tests.triton_marks import DEVICE, needs_triton


@needs_triton
def test_recall_kernel_matches_reference():
    """count_recall: the exact pages a prediction listed, per row, into the counters (with
    invalid entries on both sides, duplicates in the prediction, unequal widths, and rows
    wider than one of the kernel's chunks); its scratch is zeros again after each call."""
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
                         pred_counts.to(DEVICE), M, RecallCounters(acc, 1, 3, by_layer, mark), 2,
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
