"""Verification steps of speculative decoding in CUDA graphs, for the tiered sparse cache
(whose attention needs no host-side lists). Composed by engine.runtime.model_runner."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.layers.step_context import StepContext
from engine.runtime.graph_setup import GraphSetup
from engine.runtime.step_inputs import StepInputs, StepShape

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


@dataclass(frozen=True, slots=True)
class StagingShape:
    """The shape of a verification graph's staging: up to `n` sequences of `T` positions,
    tables of `max_pages`; padding reads and writes the `scratch` page."""

    n: int
    T: int
    max_pages: int
    scratch: int
    page_size: int


_PAD = object()  # (the owner of a padding row's table: the scratch page throughout)


def fill_verify_staging(st: np.ndarray, shape: StagingShape, size: int, batch: StepInputs,
                        held: list | None = None) -> int:  # fmt: skip
    """A verification's inputs, written with numpy into the host staging `st` (int64, laid
    out by verify_layout; no per-element Python-to-tensor conversion: 8 x 8K-page tables
    took ~4 ms through torch.tensor on a 2-core host, ~1 ms so). The B sequences' rows come
    first; the padding rows up to the graph's `size` sequences read and write only the
    scratch page (positions 0..T-1, length T). Returns how many leading elements the graph
    reads (what to copy).

    A table row is rewritten only from its first entry that may have changed: `held` (one
    entry per table row of the staging, updated here) says what a row holds from the last
    call, (owner, entries that cannot have changed since, entries written); the batch's
    `block_tables` (per sequence: the list its pages come from) and `stable_pages` (per
    sequence: its leading entries that cannot change before the next call: the pages of its
    committed tokens; a block table only grows and shrinks at its end, and a new one is a
    new list) say what to keep. An 8,193-page table takes ~0.15 ms to write whole."""
    n, T, max_pages, scratch = shape.n, shape.T, shape.max_pages, shape.scratch
    lay = verify_layout(n, T, max_pages)
    bs, rows = len(batch.kv_lens), len(batch.ids)
    owners, stable = batch.block_tables, batch.stable_pages
    pad_pos = np.arange(n * T) % T
    for name, values, pad in (("ids", batch.ids, 0), ("positions", batch.positions, pad_pos),
                              ("pages", batch.pages, scratch),
                              ("offsets", batch.offsets, pad_pos % shape.page_size)):  # fmt: skip
        a, b = lay[name]
        st[a:b] = pad
        st[a : a + rows] = values
    a, b = lay["kv_lens"]
    st[a:b] = T
    st[a : a + bs] = batch.kv_lens
    a = lay["tables"][0]
    tables = st[a : a + size * max_pages].reshape(size, max_pages)
    for i in range(size):
        if i < bs:
            p = batch.page_lists[i]
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
    """Verification steps in CUDA graphs: one graph per (batch size, k+1, page budget,
    prefetch kind), captured when first needed. The inputs of B sequences with T positions
    each go to static buffers (padding sequences write the scratch page); the tiered cache
    lists each sequence's union of per-query pages in a fixed width
    (TieredKV.verify_width_for) and flags a union that does not fit, in which case the step
    is verified again eagerly (the KV rows it wrote are rewritten the same; the summaries
    are not touched by a verification; the counters the replay added are taken back). A key
    whose width the GPU tier cannot hold, or whose replays mostly overflow, verifies
    eagerly.

    The logits returned are a view of the graph's static output: the next replay of the
    same key overwrites them (the decoder reads them at once)."""

    def __init__(self, setup: GraphSetup, enabled: bool = True) -> None:
        self.setup, self.enabled = setup, enabled
        # per key, the graphs one verification replays in order, and their logits
        self.graphs: dict[tuple, list[torch.cuda.CUDAGraph]] = {}
        self.logits: dict[tuple, torch.Tensor] = {}
        self.bufs: dict[int, dict[str, torch.Tensor]] = {}  # per T: inputs and their staging
        # copies of the tiered cache's counters, written first by each graph (_saved)
        self._saved_counters: tuple[torch.Tensor, ...] | None = None
        self.tally: dict[tuple, list[int]] = {}  # per key: replays, fallbacks
        self.off: set[tuple] = set()  # keys that verify eagerly
        self.replays = self.fallbacks = 0
        # the GPU span (CUDA events) of the last replay, and the host time of its launches
        self.span = tuple(torch.cuda.Event(enable_timing=True) for _ in range(2))
        self.last_gpu_ms = self.last_launch_ms = 0.0

    def eligible(self, shape: StepShape) -> bool:
        return self.enabled and self.setup.fits(shape)

    def _inputs(self, T: int) -> dict[str, torch.Tensor]:
        """The static inputs of the verification graphs of T positions: views of one int64
        device buffer ("meta"), filled by one copy from its pinned staging ("staging")."""
        if T not in self.bufs:
            s, n = self.setup, self.setup.max_size
            lay = verify_layout(n, T, s.max_pages)
            total = lay["tables"][1]
            meta = torch.zeros(total, dtype=torch.long, device=s.device)
            b = {name: meta[a:e] for name, (a, e) in lay.items()}
            b["tables"] = b["tables"].view(n, s.max_pages)
            b["meta"] = meta
            b["staging"] = torch.zeros(total, dtype=torch.long).pin_memory()
            b["held"] = [None] * n  # what each staged table row holds (fill_verify_staging)
            self.bufs[T] = b
        return self.bufs[T]

    def _counters(self) -> tuple[torch.Tensor, ...]:
        """The tiered cache's counters that a verification graph adds to."""
        t = self.setup.tiers
        return t._acc, t.prefetcher.recall_by_layer, t.clock

    def _saved(self) -> tuple[torch.Tensor, ...]:
        """Their copies, which each verification graph writes first (a replay whose union
        overflows takes its counts back from them)."""
        if self._saved_counters is None:
            self._saved_counters = tuple(c.clone() for c in self._counters())
        return self._saved_counters

    def _stage(self, T: int, size: int, batch: StepInputs):
        """Write a verification's inputs (an empty batch: all padding) into the staging of
        T; returns the copy that sends what the graph of `size` sequences reads, in one
        transfer."""
        s, b = self.setup, self._inputs(T)
        shape = StagingShape(s.max_size, T, s.max_pages, s.scratch_page, s.page_size)
        used = fill_verify_staging(b["staging"].numpy(), shape, size, batch, b["held"])
        return lambda: b["meta"][:used].copy_(b["staging"][:used], non_blocking=True)

    def _forward(self, size: int, T: int, hook=None) -> torch.Tensor:
        s, b = self.setup, self._inputs(T)
        rows = size * T
        ctx = StepContext(
            page_size=s.page_size, slot_pages=b["pages"][:rows],
            slot_offsets=b["offsets"][:rows], decode_only=True, verify=True,
        )  # fmt: skip
        ctx.tiers = s.tiers
        ctx.tier_tables = b["tables"][:size].to(torch.int32)
        ctx.tier_lens = b["kv_lens"][:size].to(torch.int32)
        ctx.cos, ctx.sin = s.rope(b["positions"][:rows])
        ctx.layer_hook = hook
        hidden = s.model(b["ids"][:rows], s.kv.layers, ctx)
        return s.model.compute_logits(hidden)

    def _capture(self, key: tuple) -> bool:
        """Capture the key's graphs; False where the GPU tier cannot hold its width. The
        forward is captured in up to VERIFY_CHUNKS graphs, split between layers where no
        prefetch is in flight on the side stream (a capture must end joined); they share
        the memory pool, and are replayed in order, one after the other."""
        size, T, budget, _ = key  # (prefetching or not: read at capture)
        s = self.setup
        tiers, device = s.tiers, s.device
        width = tiers.verify_width_for(size, T, budget, s.max_pages)
        if width is None:
            return False
        saved = tiers._acc.clone(), tiers.clock.clone()
        self._saved()  # (made before the capture, not in its pool)
        self._stage(T, size, StepInputs())()
        tiers.end_step(budget=budget)
        tiers.verify_width = width
        tiers.defer_summaries = True
        cuts = verify_cuts(len(s.kv.layers), VERIFY_CHUNKS)
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
            self._forward(size, T)  # warm-up: kernels compile and tune
            torch.cuda.synchronize()
            stream = torch.cuda.Stream(device)  # (a capture needs a side stream)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                graphs.append(torch.cuda.CUDAGraph())
                graphs[-1].capture_begin(pool=s.pool)
                try:
                    # the counters as they were, for a replay whose union overflows
                    for mine, theirs in zip(self._saved(), self._counters(), strict=True):
                        mine.copy_(theirs)
                    tiers.verify_overflow.zero_()
                    self.logits[key] = self._forward(size, T, split)
                finally:
                    graphs[-1].capture_end()
            torch.cuda.current_stream(device).wait_stream(stream)
            s.pool = graphs[-1].pool()
            self.graphs[key] = graphs
        finally:
            tiers.defer_summaries = False
            tiers.verify_width = None
            tiers._acc.copy_(saved[0])
            tiers.clock.copy_(saved[1])
            tiers.end_step()
        torch.cuda.synchronize()
        return True

    def replay(self, batch: StepInputs) -> torch.Tensor | None:
        """The verification's logits [B * T, V] from the graphs, or None when a sequence's
        union did not fit the graphs' width (the caller verifies eagerly)."""
        s = self.setup
        bs, T = len(batch.kv_lens), batch.query_lens[0]
        key = (s.size_for(bs), T, *s.tier_key(batch.kv_lens))
        tally = self.tally.setdefault(key, [0, 0])  # replays, fallbacks
        if key in self.off or (tally[1] >= 8 and tally[1] > tally[0]):
            return None
        if key not in self.graphs and not self._capture(key):
            self.off.add(key)
            return None
        # (the staging is free: the last replay's overflow flag was read, below)
        send = self._stage(T, key[0], batch)
        self.span[0].record()  # the step's GPU span: its input copy and replays
        send()
        t0 = time.perf_counter()
        for graph in self.graphs[key]:
            graph.replay()
        self.last_launch_ms = 1000 * (time.perf_counter() - t0)
        self.span[1].record()
        # (this read waits for the replays)
        if int(s.tiers.verify_overflow):  # a union did not fit: verify eagerly, counted once
            for mine, theirs in zip(self._saved(), self._counters(), strict=True):
                theirs.copy_(mine)
            self.fallbacks += 1
            tally[1] += 1
            return None
        self.replays += 1
        tally[0] += 1
        self.last_gpu_ms = self.span[0].elapsed_time(self.span[1])
        return self.logits[key][: bs * T]

    def reset(self) -> None:
        """Drop the captured graphs (the caller drops the shared pool with them)."""
        self.graphs.clear()
        self.logits.clear()
        self.tally.clear()
        self.off.clear()
