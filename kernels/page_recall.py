"""Recall@k of a predicted page selection against the exact one (the Forecast prefetch's
quality counter), on the device: the Triton kernel marks each row's predicted pages in a
scratch bitmap, tests the exact pages against it, then clears it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

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


@dataclass(frozen=True, slots=True)
class RecallCounters:
    """Where recall counts go (int64 device tensors): acc[hits] and acc[total], and
    by_layer [L, 2] (hits, total per layer); `mark`: int8 zeros of at least
    B * Hkv * n_pages entries, the kernel's scratch (zeros again after it; None: new)."""

    acc: torch.Tensor
    hits: int
    total: int
    by_layer: torch.Tensor
    mark: torch.Tensor | None = None


def count_recall(exact: torch.Tensor, valid: torch.Tensor, pred: torch.Tensor,
                 pred_counts: torch.Tensor, n_pages: int, counters: RecallCounters, layer: int,
                 use_triton: bool | None = None) -> None:  # fmt: skip
    """Recall@k of a predicted selection: exact pages [B, Hkv, W1] in [0, n_pages) (valid
    [B, Hkv, W1] bool), predicted pages [B, Hkv, W2] (the first pred_counts [B, Hkv] of each
    row); adds the exact pages the prediction listed and the exact pages to the counters
    (and to their row of `layer`)."""
    acc, c_hits, c_total, by_layer = counters.acc, counters.hits, counters.total, counters.by_layer
    mark = counters.mark
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
