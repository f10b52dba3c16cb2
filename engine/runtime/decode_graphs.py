"""Decode steps in CUDA graphs: one graph per batch size (with the tiered cache, per batch
size, page budget and prefetch kind, captured when first needed, as the budget grows with
the context). A step's inputs go to static device buffers in one copy; padding rows of a
batch write the scratch page. A greedy step can be launched without waiting for it, and
the step after it launched before its tokens are read back (the graph feeds its argmax to
the next step's input ids on the device)."""

from __future__ import annotations

import torch

from engine.layers.step_context import StepContext
from engine.runtime.graph_setup import GraphSetup
from engine.runtime.row_argmax import row_argmax
from engine.runtime.step_inputs import StepInputs, StepShape

# the per-sequence fields of the input buffer, in order; the block tables follow them
_FIELDS = ("ids", "positions", "pages", "offsets", "kv_lens")


def key_size(key: int | tuple) -> int:
    return key if isinstance(key, int) else key[0]


class DecodeGraphs:
    def __init__(self, setup: GraphSetup, attn_splits: int | None = None,
                 capture_now: bool = True) -> None:  # fmt: skip
        self.setup = setup
        # the paged decode kernel's split count (None: its default for the graph's rows; a
        # verification's rows take their decode step's: engine.runtime.verify_rows)
        self.attn_splits = attn_splits
        self.enabled = True  # (benchmarks switch the graphs off to time the eager path)
        s, n = setup, setup.max_size
        # all per-step inputs live in one int64 buffer, filled on the host in a pinned staging
        # copy and sent with a single transfer: [ids, positions, pages, offsets, lens, tables]
        total = 5 * n + n * s.max_pages
        # two staging buffers: the next step's inputs are written while the previous copy
        # may still be in flight (a step launched ahead)
        self.stagings = [torch.zeros(total, dtype=torch.long).pin_memory() for _ in range(2)]
        self.staging_turn = 0
        # sampled tokens come back through two pinned buffers, each with its event
        self.token_host = [torch.zeros(n, dtype=torch.long).pin_memory() for _ in range(2)]
        self.token_events = [torch.cuda.Event() for _ in range(2)]
        self.step_events = [[torch.cuda.Event(enable_timing=True) for _ in range(2)]
                            for _ in range(2)]  # fmt: skip
        self.token_turn = 0
        self.meta = torch.zeros(total, dtype=torch.long, device=s.device)
        self.fields = {name: (i * n, (i + 1) * n) for i, name in enumerate(_FIELDS)}
        f = self.fields
        for staging in self.stagings:
            st = staging.numpy()
            st[f["pages"][0] : f["pages"][1]] = s.scratch_page
            st[f["kv_lens"][0] : f["kv_lens"][1]] = 1
            st[5 * n :] = s.scratch_page
        self.meta.copy_(self.stagings[0])
        m = self.meta
        self.buf = {name: m[a:b] for name, (a, b) in f.items()}
        self.buf["block_tables"] = m[5 * n :].view(n, s.max_pages)
        self.graphs: dict[int | tuple, torch.cuda.CUDAGraph] = {}
        self.logits: dict = {}
        self.argmax: dict = {}
        # the GPU span (CUDA events) of the last step collected, for benchmarks and the
        # "timed" prefetch policy
        self.last_step_gpu_ms = 0.0
        if s.tiers is None and capture_now:  # (else each size when first needed)
            for size in sorted(s.sizes, reverse=True):
                self._capture(size)
        torch.cuda.synchronize()

    def eligible(self, shape: StepShape) -> bool:
        """A decode batch (one token per sequence) that a captured graph serves."""
        return self.enabled and all(q == 1 for q in shape.query_lens) and self.setup.fits(shape)

    def key(self, batch_size: int, kv_lens: list[int]) -> int | tuple:
        size = self.setup.size_for(batch_size)
        if self.setup.tiers is None:
            return size
        return size, *self.setup.tier_key(kv_lens)

    def forward(self, n: int) -> torch.Tensor:
        """The decode forward over the static inputs of n rows: logits [n, V]."""
        s, b = self.setup, self.buf
        ctx = StepContext(
            page_size=s.page_size,
            slot_pages=b["pages"][:n],
            slot_offsets=b["offsets"][:n],
            block_tables=b["block_tables"][:n],
            kv_lens_t=b["kv_lens"][:n],
            decode_only=True,
            attn_splits=self.attn_splits,
        )
        if s.tiers is not None:
            ctx.tiers = s.tiers
            ctx.tier_tables = b["block_tables"][:n].to(torch.int32)
            ctx.tier_lens = b["kv_lens"][:n].to(torch.int32)
        ctx.cos, ctx.sin = s.rope(b["positions"][:n])
        hidden = s.model(b["ids"][:n], s.kv.layers, ctx)
        return s.model.compute_logits(hidden)

    def _capture(self, key: int | tuple) -> None:
        """Capture the decode graph of one batch size (and, with the tiered cache, one page
        budget). Its warm-up runs on padding rows: they write the scratch page and read
        nothing else (the ids, possibly the previous graph's tokens, stay as they are)."""
        s = self.setup
        size, n, f = key_size(key), s.max_size, self.fields
        for name, pad in (("positions", 0), ("pages", s.scratch_page), ("offsets", 0),
                          ("kv_lens", 1)):  # fmt: skip
            self.meta[f[name][0] : f[name][1]] = pad
        self.meta[5 * n :] = s.scratch_page
        tiers = s.tiers
        if tiers is not None:  # the warm-up must not count as a step
            saved = tiers._acc.clone(), tiers.clock.clone()
            tiers.end_step(budget=key[1])
        self.forward(size)  # warm-up: triton compiles, allocator settles
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=s.pool):
            self.logits[key] = self.forward(size)
            self.argmax[key] = row_argmax(self.logits[key])  # (torch.argmax's, in 2 passes)
            # feed the tokens back as the next step's input, for a step launched ahead
            self.buf["ids"][:size].copy_(self.argmax[key])
        s.pool = graph.pool()
        self.graphs[key] = graph
        if tiers is not None:
            tiers._acc.copy_(saved[0])
            tiers.clock.copy_(saved[1])
            tiers.end_step()
        torch.cuda.synchronize()

    def replay(self, batch: StepInputs, ids_on_device: bool = False) -> torch.Tensor:
        """Run the step's graph (captured first if needed); its logits [B, V], a view of the
        graph's output. ids_on_device: keep the ids the previous graph wrote."""
        s = self.setup
        bs = len(batch.ids)
        key = self.key(bs, batch.kv_lens)
        if key not in self.graphs:
            self._capture(key)
        size = key_size(key)
        staging = self.stagings[self.staging_turn]
        self.staging_turn ^= 1
        # this buffer's last copy (two launches ago) is done: a step was read back since
        st, f, n = staging.numpy(), self.fields, s.max_size
        for name, values, pad in (
            ("ids", batch.ids, 0), ("positions", batch.positions, 0),
            ("pages", batch.pages, s.scratch_page), ("offsets", batch.offsets, 0),
            ("kv_lens", batch.kv_lens, 1),
        ):  # fmt: skip
            a = f[name][0]
            st[a : a + bs] = values
            st[a + bs : a + size] = pad
        tables = st[5 * n :].reshape(n, s.max_pages)
        for i, pl in enumerate(batch.page_lists):
            tables[i, : len(pl)] = pl
        used = 5 * n + size * s.max_pages
        first = n if ids_on_device else 0
        self.meta[first:used].copy_(staging[first:used], non_blocking=True)
        self.graphs[key].replay()
        return self.logits[key][:bs]

    def launch(self, batch: StepInputs, seq_ids: list[int], ahead: bool = False) -> tuple:
        """Start a greedy step on the device without waiting for it; collect() reads its
        tokens."""
        tiers = self.setup.tiers
        turn = self.token_turn
        self.token_turn ^= 1
        # the step's GPU span, for the "timed" prefetch policy (read once its tokens are)
        prefetched = tiers is not None and tiers.prefetching()
        self.step_events[turn][0].record()
        self.replay(batch, ids_on_device=ahead)
        self.step_events[turn][1].record()
        key = self.key(len(batch.ids), batch.kv_lens)
        # copy the tokens out now: the next graph, launched before they are read, rewrites
        # the argmax buffer
        self.token_host[turn][: key_size(key)].copy_(self.argmax[key], non_blocking=True)
        if tiers is not None:
            tiers.policy.read(turn)  # (read back with the tokens)
        self.token_events[turn].record()
        return turn, seq_ids, prefetched

    def collect(self, handle: tuple) -> dict[int, int]:
        """The tokens of a launched step, by sequence id (waits for the step)."""
        turn, seq_ids, prefetched = handle
        self.token_events[turn].synchronize()
        tokens = self.token_host[turn][: len(seq_ids)].tolist()
        start, end = self.step_events[turn]
        self.last_step_gpu_ms = start.elapsed_time(end)
        tiers = self.setup.tiers
        if tiers is not None:
            tiers.policy.update(turn, self.last_step_gpu_ms, prefetched, len(seq_ids))
        return dict(zip(seq_ids, tokens, strict=True))

    def reset(self) -> None:
        """Drop the captured graphs (the caller drops the shared pool with them)."""
        self.graphs.clear()
        self.logits.clear()
        self.argmax.clear()
