"""Verification steps of speculative decoding in CUDA graphs, for the tiered sparse cache
(whose attention needs no host-side lists). A mixin of engine.runtime.model_runner.ModelRunner."""

from __future__ import annotations

import time

import numpy as np
import torch

from engine.layers.step_context import StepContext

# pieces of one verification graph: its capture ends a graph and begins the next between
# layers, so that the GPU runs the first piece while the host launches the rest (a graph's
# launch takes the host time in proportion to its kernels: ~2,800 kernels, ~1 ms on the
# H200's host, bench.spec_verify --trace). The pieces double in size from one
# layer (verify_cuts): the GPU waits only for the first, small one's launch (four equal
# pieces of 8 layers: 0.3-0.5 ms of host time before the GPU could start)
VERIFY_CHUNKS = 4


def verify_cuts(layers: int, chunks: int) -> set[int]:
    """The layers after which a verification's capture starts its next graph: pieces of 1,
    2, 4, ... layers, the last one the rest, at most `chunks` pieces."""
    cuts, end, size = set(), 0, 1
    while len(cuts) < chunks - 1 and end + size < layers:
        end += size
        cuts.add(end - 1)
        size *= 2
    return cuts


def verify_layout(n: int, T: int, max_pages: int) -> dict[str, tuple[int, int]]:
    """Where each input of a verification graph (up to n sequences of T positions) lies in
    its one int64 buffer: ids, positions, pages, offsets (n * T each), the n lengths, then
    the n tables of max_pages."""
    layout, at = {}, 0
    for name, size in (("ids", n * T), ("positions", n * T), ("pages", n * T),
                       ("offsets", n * T), ("kv_lens", n), ("tables", n * max_pages)):  # fmt: skip
        layout[name] = (at, at + size)
        at += size
    return layout


_PAD = object()  # (the owner of a padding row's table: the scratch page throughout)


def fill_verify_staging(st: np.ndarray, n: int, T: int, max_pages: int, size: int,
                        scratch: int, page_size: int, ids, positions, pages, offsets, kv_lens,
                        page_lists, held: list | None = None, owners=(),
                        stable=()) -> int:  # fmt: skip
    """A verification's inputs, written with numpy into the host staging `st` (int64, laid
    out by verify_layout; no per-element Python-to-tensor conversion: 8 x 8K-page tables
    took ~4 ms through torch.tensor on a 2-core host, ~1 ms so). The B sequences' rows come
    first; the padding rows up to the graph's `size` sequences read and write only the
    scratch page (positions 0..T-1, length T). Returns how many leading elements the graph
    reads (what to copy).

    A table row is rewritten only from its first entry that may have changed: `held` (one
    entry per table row of the staging, updated here) says what a row holds from the last
    call, (owner, entries that cannot have changed since, entries written); `owners` (per
    sequence: the list its pages come from, its block table) and `stable` (per sequence:
    its leading entries that cannot change before the next call: the pages of its
    committed tokens; a block table only grows and shrinks at its end, and a new one is a
    new list) say what to keep. An 8,193-page table takes ~0.15 ms to write whole."""
    lay = verify_layout(n, T, max_pages)
    bs, rows = len(kv_lens), len(ids)
    pad_pos = np.arange(n * T) % T
    for name, values, pad in (("ids", ids, 0), ("positions", positions, pad_pos),
                              ("pages", pages, scratch),
                              ("offsets", offsets, pad_pos % page_size)):  # fmt: skip
        a, b = lay[name]
        st[a:b] = pad
        st[a : a + rows] = values
    a, b = lay["kv_lens"]
    st[a:b] = T
    st[a : a + bs] = kv_lens
    a = lay["tables"][0]
    tables = st[a : a + size * max_pages].reshape(size, max_pages)
    for i in range(size):
        if i < bs:
            p = page_lists[i]
            owner = owners[i] if i < len(owners) else None
            kept_next = 0 if owner is None else min(stable[i], len(p))
        else:
            p, owner, kept_next = (), _PAD, 0
        last = held[i] if held is not None else None
        if owner is not None and last is not None and last[0] is owner:
            keep, written = min(last[1], len(p)), last[2]
        else:
            keep, written = 0, max_pages
        tables[i, keep : len(p)] = p[keep:]
        if written > len(p):
            tables[i, len(p) : written] = scratch
        if held is not None:
            held[i] = (owner, kept_next, len(p))
    return a + size * max_pages


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
        """The static inputs of the verification graphs of T positions: views of one int64
        device buffer ("meta"), filled by one copy from its pinned staging ("staging")."""
        if T not in self.vbuf:
            n = max(self.graph_sizes)
            lay = verify_layout(n, T, self.max_pages)
            total = lay["tables"][1]
            meta = torch.zeros(total, dtype=torch.long, device=self.device)
            b = {name: meta[a:e] for name, (a, e) in lay.items()}
            b["tables"] = b["tables"].view(n, self.max_pages)
            b["meta"] = meta
            b["staging"] = torch.zeros(total, dtype=torch.long).pin_memory()
            b["held"] = [None] * n  # what each staged table row holds (fill_verify_staging)
            self.vbuf[T] = b
        return self.vbuf[T]

    def _verify_counters(self) -> tuple[torch.Tensor, ...]:
        """The tiered cache's counters that a verification graph adds to."""
        t = self.tiers
        return t._acc, t.recall_by_layer, t.clock

    def _verify_saved(self) -> tuple[torch.Tensor, ...]:
        """Their copies, which each verification graph writes first (a replay whose union
        overflows takes its counts back from them)."""
        if self._vsaved is None:
            self._vsaved = tuple(c.clone() for c in self._verify_counters())
        return self._vsaved

    def _stage_verify_inputs(self, T: int, size: int, ids=(), positions=(), pages=(),
                             offsets=(), kv_lens=(), page_lists=(), owners=(),
                             stable=()):  # fmt: skip
        """Write a verification's inputs (none: all padding) into the staging of T; returns
        the copy that sends what the graph of `size` sequences reads, in one transfer."""
        b = self._verify_inputs(T)
        used = fill_verify_staging(b["staging"].numpy(), max(self.graph_sizes), T,
                                   self.max_pages, size, self.scratch_page, self.page_size,
                                   ids, positions, pages, offsets, kv_lens, page_lists,
                                   b["held"], owners, stable)  # fmt: skip
        return lambda: b["meta"][:used].copy_(b["staging"][:used], non_blocking=True)

    def _verify_forward(self, size: int, T: int, hook=None) -> torch.Tensor:
        b = self._verify_inputs(T)
        rows = size * T
        ctx = StepContext(
            page_size=self.page_size, slot_pages=b["pages"][:rows],
            slot_offsets=b["offsets"][:rows], decode_only=True, verify=True,
        )  # fmt: skip
        ctx.tiers = self.tiers
        ctx.tier_tables = b["tables"][:size].to(torch.int32)
        ctx.tier_lens = b["kv_lens"][:size].to(torch.int32)
        ctx.cos, ctx.sin = self.rope(b["positions"][:rows])
        ctx.layer_hook = hook
        hidden = self.model(b["ids"][:rows], self.kv.layers, ctx)
        return self.model.compute_logits(hidden)

    def _capture_verify(self, key: tuple[int, int, int]) -> bool:
        """Capture the key's graphs; False where the GPU tier cannot hold its width. The
        forward is captured in up to VERIFY_CHUNKS graphs, split between layers where no
        prefetch is in flight on the side stream (a capture must end joined); they share
        the memory pool, and are replayed in order, one after the other."""
        size, T, budget, _ = key  # (prefetching or not: read at capture)
        tiers = self.tiers
        width = tiers.verify_width_for(size, T, budget, self.max_pages)
        if width is None:
            return False
        saved = tiers._acc.clone(), tiers.clock.clone()
        self._verify_saved()  # (made before the capture, not in its pool)
        self._stage_verify_inputs(T, size)()
        tiers.end_step(budget=budget)
        tiers.verify_width = width
        tiers.defer_summaries = True
        cuts = verify_cuts(len(self.kv.layers), VERIFY_CHUNKS)
        graphs: list[torch.cuda.CUDAGraph] = []

        def split(layer: int) -> None:  # (after `layer`: end this graph, begin the next)
            if layer not in cuts:
                return
            if any(e is not None for e in tiers.prefetcher.pending.values()):
                return  # (a prefetch forked for the next layer: not a place to cut)
            graphs[-1].capture_end()
            graphs.append(torch.cuda.CUDAGraph())
            graphs[-1].capture_begin(pool=graphs[-2].pool())  # (one pool for all)

        try:
            self._verify_forward(size, T)  # warm-up: kernels compile and tune
            torch.cuda.synchronize()
            stream = torch.cuda.Stream(self.device)  # (a capture needs a side stream)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                graphs.append(torch.cuda.CUDAGraph())
                graphs[-1].capture_begin(pool=self.graph_pool)
                try:
                    # the counters as they were, for a replay whose union overflows
                    for mine, theirs in zip(self._verify_saved(), self._verify_counters(),
                                            strict=True):  # fmt: skip
                        mine.copy_(theirs)
                    tiers.verify_overflow.zero_()
                    self.vgraph_logits[key] = self._verify_forward(size, T, split)
                finally:
                    graphs[-1].capture_end()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self.graph_pool = graphs[-1].pool()
            self.vgraphs[key] = graphs
        finally:
            tiers.defer_summaries = False
            tiers.verify_width = None
            tiers._acc.copy_(saved[0])
            tiers.clock.copy_(saved[1])
            tiers.end_step()
        torch.cuda.synchronize()
        return True

    def _run_verify_graph(self, ids, positions, pages, offsets, kv_lens, page_lists, T,
                          owners=(), stable=()):  # fmt: skip
        """The verification's logits [B * T, V] from the graphs, or None when a sequence's
        union did not fit the graphs' width (the caller verifies eagerly). `owners`,
        `stable`: each sequence's block table and its pages that cannot change before the
        next verification (fill_verify_staging)."""
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
        if self.verify_span is None:
            self.verify_span = tuple(torch.cuda.Event(enable_timing=True) for _ in range(2))
        # (the staging is free: the last replay's overflow flag was read, below)
        send = self._stage_verify_inputs(T, size, ids, positions, pages, offsets, kv_lens,
                                         page_lists, owners, stable)  # fmt: skip
        self.verify_span[0].record()  # the step's GPU span: its input copy and replays
        send()
        tiers = self.tiers
        t0 = time.perf_counter()
        for graph in self.vgraphs[key]:
            graph.replay()
        self.last_verify_launch_ms = 1000 * (time.perf_counter() - t0)
        self.verify_span[1].record()
        # (this read waits for the replays)
        if int(tiers.verify_overflow):  # a union did not fit: verify eagerly, counted once
            for mine, theirs in zip(self._verify_saved(), self._verify_counters(), strict=True):
                theirs.copy_(mine)
            self.verify_fallbacks += 1
            tally[1] += 1
            return None
        self.verify_replays += 1
        tally[0] += 1
        self.last_verify_gpu_ms = self.verify_span[0].elapsed_time(self.verify_span[1])
        return self.vgraph_logits[key][: bs * T]
