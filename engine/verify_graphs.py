"""Verification steps of speculative decoding in CUDA graphs, for the tiered sparse cache
(whose attention needs no host-side lists). A mixin of engine.model_runner.ModelRunner."""

from __future__ import annotations

import numpy as np
import torch

from engine.step_context import StepContext

_LONG_FIELDS = ("ids", "positions", "pages", "offsets")


def fill_verify_staging(longs: np.ndarray, ints: np.ndarray, n: int, T: int, max_pages: int,
                        scratch: int, ids, positions, pages, offsets, kv_lens,
                        page_lists) -> int:  # fmt: skip
    """A verification's inputs, written with numpy into host staging (no per-element
    Python-to-tensor conversion: 8 x 8K-page tables took ~4 ms through torch.tensor on a
    2-core host, ~1 ms so): `longs` [4 * n * T] holds ids, positions, pages and offsets
    (n * T each, the first B * T written); `ints` [n + n * max_pages] the B lengths, then the
    tables (row b: sequence b's pages, then `scratch` to the end of the row). Returns the
    widest table's length."""
    rows = len(ids)
    for i, values in enumerate((ids, positions, pages, offsets)):
        longs[i * n * T : i * n * T + rows] = values
    bs = len(kv_lens)
    ints[:bs] = kv_lens
    width = max(len(p) for p in page_lists)
    tables = ints[n:].reshape(n, max_pages)
    tables[:bs] = scratch
    for b, p in enumerate(page_lists):
        tables[b, : len(p)] = p
    return width


class VerifyGraphs:
    """Verification steps in CUDA graphs (a mixin of ModelRunner): one graph per (batch
    size, k+1, page budget), captured when first needed. The inputs of B sequences with T
    positions each go to static buffers (padding sequences write the scratch page); the
    tiered cache lists each sequence's union of per-query pages in a fixed width
    (TieredKV.verify_width_for) and flags a union that does not fit, in which case the
    step is verified again eagerly (the KV rows it wrote are rewritten the same; the
    summaries are not touched by a verification; the counters the replay added are taken
    back). A key whose width the GPU tier cannot hold, or whose replays mostly overflow,
    verifies eagerly.

    The logits returned are a view of the graph's static output: the next replay of the
    same key overwrites them (the decoder reads them at once)."""

    def _verify_inputs(self, T: int) -> dict[str, torch.Tensor]:
        if T not in self.vbuf:
            n = max(self.graph_sizes)
            dev, long = self.device, torch.long
            self.vbuf[T] = {
                "ids": torch.zeros(n * T, dtype=long, device=dev),
                "positions": torch.zeros(n * T, dtype=long, device=dev),
                "pages": torch.full((n * T,), self.scratch_page, dtype=long, device=dev),
                "offsets": torch.zeros(n * T, dtype=long, device=dev),
                "kv_lens": torch.full((n,), T, dtype=torch.int32, device=dev),
                "tables": torch.full(
                    (n, self.max_pages), self.scratch_page, dtype=torch.int32, device=dev
                ),  # fmt: skip
            }
        return self.vbuf[T]

    def _verify_forward(self, size: int, T: int) -> torch.Tensor:
        b = self._verify_inputs(T)
        rows = size * T
        ctx = StepContext(
            page_size=self.page_size, slot_pages=b["pages"][:rows],
            slot_offsets=b["offsets"][:rows], decode_only=True, verify=True,
        )  # fmt: skip
        ctx.tiers = self.tiers
        ctx.tier_tables = b["tables"][:size]
        ctx.tier_lens = b["kv_lens"][:size]
        ctx.cos, ctx.sin = self.rope(b["positions"][:rows])
        hidden = self.model(b["ids"][:rows], self.kv.layers, ctx)
        return self.model.compute_logits(hidden)

    def _pad_verify_inputs(self, T: int) -> None:
        b = self._verify_inputs(T)
        b["positions"].copy_(torch.arange(b["positions"].numel(), device=self.device) % T)
        b["pages"].fill_(self.scratch_page)
        b["offsets"].copy_(b["positions"] % self.page_size)
        b["kv_lens"].fill_(T)
        b["tables"].fill_(self.scratch_page)

    def _capture_verify(self, key: tuple[int, int, int]) -> bool:
        """Capture the key's graph; False where the GPU tier cannot hold its width."""
        size, T, budget, _ = key  # (prefetching or not: read at capture)
        tiers = self.tiers
        width = tiers.verify_width_for(size, T, budget, self.max_pages)
        if width is None:
            return False
        saved = tiers._acc.clone(), tiers.clock.clone()
        self._pad_verify_inputs(T)
        tiers.end_step(budget=budget)
        tiers.verify_width = width
        tiers.defer_summaries = True
        try:
            self._verify_forward(size, T)  # warm-up: kernels compile and tune
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool):
                tiers.verify_overflow.zero_()
                self.vgraph_logits[key] = self._verify_forward(size, T)
            self.graph_pool = graph.pool()
            self.vgraphs[key] = graph
        finally:
            tiers.defer_summaries = False
            tiers.verify_width = None
            tiers._acc.copy_(saved[0])
            tiers.clock.copy_(saved[1])
            tiers.end_step()
        torch.cuda.synchronize()
        return True

    def _run_verify_graph(self, ids, positions, pages, offsets, kv_lens, page_lists, T):
        """The verification's logits [B * T, V] from a graph, or None when a sequence's
        union did not fit the graph's width (the caller verifies eagerly)."""
        bs = len(kv_lens)
        size = self._graph_size(bs)
        key = (
            size,
            T,
            self.tiers.budget_for(max(kv_lens), self.max_pages),
            self.tiers.prefetching(),
        )  # (the "auto" prefetch policy: both kinds)
        tally = self.vgraph_tally.setdefault(key, [0, 0])  # replays, fallbacks
        if key in self.vgraph_off or (tally[1] >= 8 and tally[1] > tally[0]):
            return None
        if key not in self.vgraphs and not self._capture_verify(key):
            self.vgraph_off.add(key)
            return None
        b = self._verify_inputs(T)
        rows, n = bs * T, max(self.graph_sizes)
        self._pad_verify_inputs(T)
        # host staging (pinned, one per T; reused once the replay below is known done)
        if T not in self.vstage:
            self.vstage[T] = (torch.zeros(4 * n * T, dtype=torch.long).pin_memory(),
                              torch.zeros(n + n * self.max_pages, dtype=torch.int32).pin_memory())  # fmt: skip
        longs, ints = self.vstage[T]
        if self.verify_span is None:
            self.verify_span = tuple(torch.cuda.Event(enable_timing=True) for _ in range(2))
        fill_verify_staging(longs.numpy(), ints.numpy(), n, T, self.max_pages,
                            self.scratch_page, ids, positions, pages, offsets, kv_lens,
                            page_lists)  # fmt: skip
        self.verify_span[0].record()  # the step's GPU span: its input copies and replay
        for i, name in enumerate(_LONG_FIELDS):
            b[name][:rows].copy_(longs[i * n * T : i * n * T + rows], non_blocking=True)
        b["kv_lens"][:bs].copy_(ints[:bs], non_blocking=True)
        b["tables"][:bs].copy_(ints[n : n + bs * self.max_pages].view(bs, self.max_pages),
                               non_blocking=True)  # fmt: skip
        tiers = self.tiers
        saved = tiers._acc.clone(), tiers.recall_by_layer.clone(), tiers.clock.clone()
        self.vgraphs[key].replay()
        self.verify_span[1].record()
        # (this read waits for the replay, and so for the staging's copies before it)
        if int(tiers.verify_overflow):  # a union did not fit: verify eagerly, counted once
            tiers._acc.copy_(saved[0])
            tiers.recall_by_layer.copy_(saved[1])
            tiers.clock.copy_(saved[2])
            self.verify_fallbacks += 1
            tally[1] += 1
            return None
        self.verify_replays += 1
        tally[0] += 1
        self.last_verify_gpu_ms = self.verify_span[0].elapsed_time(self.verify_span[1])
        return self.vgraph_logits[key][:rows]
