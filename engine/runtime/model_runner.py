"""Runs one scheduled step on the model: builds the step's tensors, runs the forward pass
(through a captured CUDA graph for decode batches on GPU), and samples."""

from __future__ import annotations

import time

import torch

from engine.config import EngineConfig, ModelConfig
from engine.kv.dense_kv import DenseKV
from engine.kv.pool import KVCache
from engine.layers.rope import RotaryEmbedding
from engine.layers.sampler import sample
from engine.layers.step_context import StepContext
from engine.models.causal_lm import CausalLM
from engine.runtime.scheduler import SchedulerOutput
from engine.runtime.verify_graphs import VerifyGraphs


class ModelRunner(VerifyGraphs):
    def __init__(
        self,
        model: CausalLM,
        cfg: ModelConfig,
        engine_cfg: EngineConfig,
        max_model_len: int,
        num_pages: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.model, self.cfg, self.engine_cfg = model, cfg, engine_cfg
        self.device, self.dtype = device, dtype
        self.page_size = engine_cfg.page_size
        self.max_model_len = max_model_len
        self.max_pages = -(-max_model_len // self.page_size)
        # the last page is scratch: padded rows of a CUDA-graph batch write their KV there
        # with sparse decode on a GPU, the pool is the host tier: pinned host memory
        host_tier = engine_cfg.sparse is not None and device.type == "cuda"
        self.kv = KVCache(cfg, num_pages + 1, self.page_size, dtype, device, pinned=host_tier)
        self.scratch_page = num_pages
        self.rope = RotaryEmbedding(cfg, max_model_len, device, dtype)
        self.generators: dict[int, torch.Generator] = {}
        self.prefill_attn_dtype: torch.dtype | None = None
        # CPU attention reads a contiguous per-sequence copy instead of gathering pages
        self.use_dense_kv = device.type == "cpu" and engine_cfg.cpu_dense_kv
        self.dense_kv: dict[int, DenseKV] = {}
        self.tiers = None
        if engine_cfg.sparse is not None:
            from engine.kv import TieredKV
            from engine.kv.residency import SlotAllocator

            allocator = SlotAllocator(kernels=engine_cfg.tier_alloc == "triton",
                                      gather_programs=engine_cfg.gather_programs)  # fmt: skip
            self.tiers = TieredKV(self.kv.pool, self.page_size, engine_cfg.sparse, device,
                                  forecast=make_forecast(model, engine_cfg.sparse),
                                  allocator=allocator)  # fmt: skip
        # decode graphs by batch size; with the tiered cache by (batch size, page budget),
        # captured when first needed (the budget grows with the context)
        self.graphs: dict[int | tuple, torch.cuda.CUDAGraph] = {}
        sp = engine_cfg.sparse
        self.use_graphs = (
            engine_cfg.cuda_graphs
            and device.type == "cuda"
            and cfg.rope_type != "dynamic"
            # the stochastic tail goes back to the host each step
            and not (sp is not None and sp.tail_pages)
        )
        self.graph_sizes = self._graph_sizes() if self.use_graphs else []
        # verification in CUDA graphs (EngineConfig.verify_graphs; tiered cache only)
        self.verify_graphs = self.use_graphs and self.tiers is not None and engine_cfg.verify_graphs
        # per key, the graphs one verification replays in order (engine.runtime.verify_graphs)
        self.vgraphs: dict[tuple[int, int, int], list[torch.cuda.CUDAGraph]] = {}
        self.vgraph_logits: dict[tuple[int, int, int], torch.Tensor] = {}
        self.vbuf: dict[int, dict[str, torch.Tensor]] = {}  # per T: inputs and their staging
        self._vsaved: tuple[torch.Tensor, ...] | None = None  # (VerifyGraphs._verify_saved)
        self.vgraph_tally: dict[tuple[int, int, int], list[int]] = {}
        self.vgraph_off: set[tuple[int, int, int]] = set()
        self.verify_replays = self.verify_fallbacks = 0
        # GPU spans (CUDA events; kernels and the gaps between them) of the last decode
        # graph step and the last verification graph replay, for benchmarks
        self.verify_span: tuple | None = None
        self.last_step_gpu_ms = self.last_verify_gpu_ms = 0.0
        self.last_verify_launch_ms = 0.0  # host time of the last verification's replays
        if self.use_graphs:
            self.capture_graphs()

    # -- step inputs ---------------------------------------------------------------------

    def _to_device(self, values: list[int], dtype=torch.long) -> torch.Tensor:
        t = torch.tensor(values, dtype=dtype)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def prepare(self, out: SchedulerOutput, ahead: bool = False):
        """Host-side inputs of a step. ahead: the step after the one in flight, whose input
        tokens are still on the device (positions one further; ids are placeholders)."""
        ids, positions, pages, offsets, rope_lens, sample_idx = [], [], [], [], [], []
        query_lens, kv_lens, page_lists = [], [], []
        P = self.page_size
        for item in out.scheduled:
            seq, start, n = item.seq, item.seq.num_computed_tokens + ahead, item.num_tokens
            end = start + n
            if ahead:
                ids += [0] * n
            elif item.draft:  # a verification: the last token, then the draft
                ids += (seq.token_ids[start:] + list(item.draft))[:n]
            else:
                ids += seq.token_ids[start:end]
            positions += range(start, end)
            pages += [seq.block_table[p // P] for p in range(start, end)]
            offsets += [p % P for p in range(start, end)]
            rope_lens += [end] * n
            query_lens.append(n)
            kv_lens.append(end)
            page_lists.append(seq.block_table[: -(-end // P)])
            if item.samples:
                sample_idx.append(len(ids) - 1)
        return (
            ids,
            positions,
            pages,
            offsets,
            rope_lens,
            sample_idx,
            query_lens,
            kv_lens,
            page_lists,
        )

    # -- execution -----------------------------------------------------------------------

    @torch.inference_mode()
    def graph_eligible(self, out: SchedulerOutput) -> bool:
        """A greedy decode batch that a captured graph serves, argmax included."""
        items = out.scheduled
        return (
            self.use_graphs
            and all(
                it.num_tokens == 1 and it.samples and it.seq.params.plain_greedy for it in items
            )
            and self._graph_size(len(items)) is not None
            and not self._windowed([len(it.seq) + 1 for it in items])
        )

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, ahead: bool = False) -> tuple:
        """Start a graph-eligible step on the device without waiting for it."""
        ids, positions, pages, offsets, _, _, _, kv_lens, page_lists = self.prepare(out, ahead)
        turn = self.token_turn
        self.token_turn ^= 1
        # the step's GPU span, for the "timed" prefetch policy (read once its tokens are)
        prefetched = self.tiers is not None and self.tiers.prefetching()
        self.step_events[turn][0].record()
        self._run_graph(ids, positions, pages, offsets, kv_lens, page_lists, ids_on_device=ahead)
        self.step_events[turn][1].record()
        key = self._graph_key(len(ids), kv_lens)
        # copy the tokens out now: the next graph, launched before they are read, rewrites
        # the argmax buffer
        self.token_host[turn][: key_size(key)].copy_(self.graph_argmax[key], non_blocking=True)
        if self.tiers is not None:
            self.tiers.policy.read(turn)  # (read back with the tokens)
        self.token_events[turn].record()
        return turn, [it.seq.seq_id for it in out.scheduled], prefetched

    def collect(self, handle: tuple) -> dict[int, int]:
        turn, seq_ids, prefetched = handle
        self.token_events[turn].synchronize()
        tokens = self.token_host[turn][: len(seq_ids)].tolist()
        start, end = self.step_events[turn]
        self.last_step_gpu_ms = start.elapsed_time(end)
        if self.tiers is not None:
            self.tiers.policy.update(turn, self.last_step_gpu_ms, prefetched, len(seq_ids))
        return dict(zip(seq_ids, tokens, strict=True))

    @torch.inference_mode()
    def run(self, out: SchedulerOutput) -> dict[int, int]:
        """Run one step; returns the sampled token for each sequence that samples."""
        if self.graph_eligible(out):
            return self.collect(self.launch(out))
        t0 = time.perf_counter()
        prefetched = self.tiers is not None and self.tiers.prefetching()
        (ids, positions, pages, offsets, rope_lens, sample_idx,
         query_lens, kv_lens, page_lists) = self.prepare(out)  # fmt: skip
        sampling = [item for item in out.scheduled if item.samples]
        params = [item.seq.params for item in sampling]
        if (
            self.use_graphs
            and all(q == 1 for q in query_lens)
            and self._graph_size(len(ids))
            and not self._windowed(kv_lens)
        ):
            logits = self._run_graph(ids, positions, pages, offsets, kv_lens, page_lists)
        else:
            hidden = self.eager_hidden(
                ids, positions, pages, offsets, rope_lens, query_lens, kv_lens, page_lists,
                self._dense_kv_for(out),
            )  # fmt: skip
            logits = self.model.compute_logits(hidden[self._to_device(sample_idx)])
        gens = [self._generator(item.seq) for item in sampling]
        generated = [item.seq.completion_token_ids for item in sampling]
        tokens = sample(logits[: len(sampling)].float(), params, gens, generated)
        if self.tiers is not None and all(q == 1 for q in query_lens):  # decode steps only
            self.tiers.policy.read(wait=True)  # (the tokens are on the host: the step is done)
            ms = 1000 * (time.perf_counter() - t0)
            self.tiers.policy.update(0, ms, prefetched, len(query_lens))
        return {item.seq.seq_id: tok for item, tok in zip(sampling, tokens, strict=True)}

    @torch.inference_mode()
    def verify(self, out: SchedulerOutput) -> torch.Tensor:
        """A verification step: every scheduled sequence runs its last token and its draft
        (the same count each); returns the logits at every position [B, k+1, V]. With the
        tiered cache the k+1 queries share one fetch, and the rows fold into the summaries
        only when `after_verify` says which were accepted."""
        (ids, positions, pages, offsets, rope_lens, _, query_lens, kv_lens,
         page_lists) = self.prepare(out)  # fmt: skip
        assert len(set(query_lens)) == 1, "a verification runs k+1 positions per sequence"
        if (
            self.verify_graphs
            and self._graph_size(len(query_lens)) is not None
            and not self._windowed(kv_lens)
        ):
            seqs = [it.seq for it in out.scheduled]
            # (a sequence's pages up to its last computed token stay as they are)
            logits = self._run_verify_graph(
                ids, positions, pages, offsets, kv_lens, page_lists, query_lens[0],
                [s.block_table for s in seqs],
                [-(-s.num_computed_tokens // self.page_size) for s in seqs],
            )  # fmt: skip
            if logits is not None:
                return logits.view(len(query_lens), query_lens[0], -1)
        if self.tiers is not None:
            self.tiers.defer_summaries = True
        try:
            hidden = self.eager_hidden(
                ids, positions, pages, offsets, rope_lens, query_lens, kv_lens, page_lists,
                self._dense_kv_for(out), verify=True,
            )  # fmt: skip
        finally:
            if self.tiers is not None:
                self.tiers.defer_summaries = False
        logits = self.model.compute_logits(hidden, exact=True)
        return logits.view(len(query_lens), query_lens[0], -1)

    def after_verify(self, seq, start: int, table: list[int], bm) -> list[int]:
        """After a verification from position `start`: the positions up to
        seq.num_computed_tokens hold accepted rows (fold them into the summaries); the
        blocks taken for the rejected ones go back (and leave the GPU tier). `table`: the
        sequence's block table during the verification. Returns the blocks given back."""
        P = self.page_size
        done = range(start, seq.num_computed_tokens)
        if self.tiers is not None:
            self.tiers.fold_rows([table[p // P] for p in done], [p % P for p in done])
        if seq.is_finished or not seq.block_table:
            return []
        freed = bm.trim(seq, len(seq))
        if self.tiers is not None:
            self.tiers.drop_pages(freed)
        return freed

    def eager_hidden(
        self, ids, positions, pages, offsets, rope_lens, query_lens, kv_lens, page_lists,
        dense_kv: list | None = None, verify: bool = False,
    ):  # fmt: skip
        """Forward pass without CUDA graphs: final hidden states [T, hidden]. verify: the
        step is a verification (k+1 query tokens per sequence: sparse over the tiers)."""
        ctx = StepContext(
            page_size=self.page_size,
            slot_pages=self._to_device(pages),
            slot_offsets=self._to_device(offsets),
            query_lens=query_lens,
            kv_lens=kv_lens,
            page_lists=[self._to_device(p) for p in page_lists],
            sliding_window=self.cfg.sliding_window,
            prefill_attn_dtype=None if verify else self.prefill_attn_dtype,
            dense_kv=dense_kv,
            verify=verify,
        )
        ctx.cos, ctx.sin = self.rope(
            self._to_device(positions), rope_lens if self.rope.dynamic else None
        )
        n = query_lens[0]
        decode = (n == 1 or verify) and all(q == n for q in query_lens)  # decode or verify
        if self.tiers is not None:
            ctx.tiers = self.tiers
            self.tiers.end_step(max(kv_lens))
            if decode:
                width = max(len(p) for p in page_lists)
                tables = [list(p) + [0] * (width - len(p)) for p in page_lists]
                ctx.tier_tables = self._to_device(tables, torch.int32).view(len(tables), width)
                ctx.tier_lens = self._to_device(kv_lens, torch.int32)
        return self.model(self._to_device(ids), self.kv.layers, ctx)

    def _windowed(self, kv_lens: list[int]) -> bool:
        w = self.cfg.sliding_window
        return w is not None and max(kv_lens) > w

    def _generator(self, seq) -> torch.Generator | None:
        if seq.params.greedy:
            return None
        gen = self.generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            if seq.params.seed is not None:
                gen.manual_seed(seq.params.seed)
            else:
                gen.seed()
            self.generators[seq.seq_id] = gen
        return gen

    def release(self, seq_id: int) -> None:
        self.generators.pop(seq_id, None)
        self.dense_kv.pop(seq_id, None)

    def _dense_kv_for(self, out: SchedulerOutput) -> list | None:
        if not self.use_dense_kv:
            return None
        n = self.cfg.num_layers
        return [self.dense_kv.setdefault(it.seq.seq_id, DenseKV(n)) for it in out.scheduled]

    # -- CUDA graphs for decode ----------------------------------------------------------

    def _graph_size(self, bs: int) -> int | None:
        return next((s for s in self.graph_sizes if s >= bs), None)

    def _graph_key(self, bs: int, kv_lens: list[int]) -> int | tuple:
        size = self._graph_size(bs)
        if self.tiers is None:
            return size
        # (prefetching or not: two graphs, the "auto" prefetch policy switches between them)
        return size, self.tiers.budget_for(max(kv_lens), self.max_pages), self.tiers.prefetching()

    def _graph_sizes(self) -> list[int]:
        sizes = [1, 2, 4, 8] + list(range(16, self.engine_cfg.max_num_seqs + 1, 16))
        return [s for s in sizes if s <= max(1, self.engine_cfg.max_num_seqs)]

    def _decode_forward(self, n: int) -> torch.Tensor:
        b = self.gbuf
        ctx = StepContext(
            page_size=self.page_size,
            slot_pages=b["pages"][:n],
            slot_offsets=b["offsets"][:n],
            block_tables=b["block_tables"][:n],
            kv_lens_t=b["kv_lens"][:n],
            decode_only=True,
        )
        if self.tiers is not None:
            ctx.tiers = self.tiers
            ctx.tier_tables = b["block_tables"][:n].to(torch.int32)
            ctx.tier_lens = b["kv_lens"][:n].to(torch.int32)
        ctx.cos, ctx.sin = self.rope(b["positions"][:n])
        hidden = self.model(b["ids"][:n], self.kv.layers, ctx)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture_graphs(self) -> None:
        sizes = self._graph_sizes()
        n = max(sizes)
        # all per-step inputs live in one int64 buffer, filled on the host in a pinned staging
        # copy and sent with a single transfer: [ids, positions, pages, offsets, lens, tables]
        total = 5 * n + n * self.max_pages
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
        self.meta = torch.zeros(total, dtype=torch.long, device=self.device)
        fields = {}
        for i, name in enumerate(("ids", "positions", "pages", "offsets", "kv_lens")):
            fields[name] = (i * n, (i + 1) * n)
        self.meta_fields = fields
        for staging in self.stagings:
            st = staging.numpy()
            st[fields["pages"][0] : fields["pages"][1]] = self.scratch_page
            st[fields["kv_lens"][0] : fields["kv_lens"][1]] = 1
            st[5 * n :] = self.scratch_page
        self.meta.copy_(self.stagings[0])
        m = self.meta
        self.gbuf = {name: m[a:b] for name, (a, b) in fields.items()}
        self.gbuf["block_tables"] = m[5 * n :].view(n, self.max_pages)
        self.graph_logits: dict = {}
        self.graph_argmax: dict = {}
        self.graph_pool = None
        if self.tiers is None:
            for size in sorted(self.graph_sizes, reverse=True):
                self._capture(size)
        torch.cuda.synchronize()

    def _capture(self, key: int | tuple) -> None:
        """Capture the decode graph of one batch size (and, with the tiered cache, one page
        budget). Its warm-up runs on padding rows: they write the scratch page and read
        nothing else (the ids, possibly the previous graph's tokens, stay as they are)."""
        size, n = key_size(key), max(self.graph_sizes)
        f = self.meta_fields
        for name, pad in (("positions", 0), ("pages", self.scratch_page), ("offsets", 0),
                          ("kv_lens", 1)):  # fmt: skip
            self.meta[f[name][0] : f[name][1]] = pad
        self.meta[5 * n :] = self.scratch_page
        tiers = self.tiers
        if tiers is not None:  # the warm-up must not count as a step
            saved = tiers._acc.clone(), tiers.clock.clone()
            tiers.end_step(budget=key[1])
        self._decode_forward(size)  # warm-up: triton compiles, allocator settles
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            self.graph_logits[key] = self._decode_forward(size)
            self.graph_argmax[key] = self.graph_logits[key].argmax(dim=-1)
            # feed the tokens back as the next step's input, for a step launched ahead
            self.gbuf["ids"][:size].copy_(self.graph_argmax[key])
        self.graph_pool = graph.pool()
        self.graphs[key] = graph
        if tiers is not None:
            tiers._acc.copy_(saved[0])
            tiers.clock.copy_(saved[1])
            tiers.end_step()
        torch.cuda.synchronize()

    def reset_graphs(self) -> None:
        """Drop the captured decode graphs of the tiered cache (they are captured again when
        needed), e.g. after its selection settings change."""
        if self.tiers is not None and self.use_graphs:
            torch.cuda.synchronize()
            self.graphs.clear()
            self.graph_pool = None  # a pool whose graphs are all gone cannot be reused
            self.graph_logits.clear()
            self.graph_argmax.clear()
            self.vgraphs.clear()
            self.vgraph_logits.clear()
            self.vgraph_tally.clear()
            self.vgraph_off.clear()

    def _run_graph(
        self, ids, positions, pages, offsets, kv_lens, page_lists, ids_on_device: bool = False
    ) -> torch.Tensor:
        bs = len(ids)
        key = self._graph_key(bs, kv_lens)
        if key not in self.graphs:
            self._capture(key)
        size = key_size(key)
        staging = self.stagings[self.staging_turn]
        self.staging_turn ^= 1
        # this buffer's last copy (two launches ago) is done: a step was read back since
        st, f, n = staging.numpy(), self.meta_fields, max(self.graph_sizes)
        for name, values, pad in (
            ("ids", ids, 0), ("positions", positions, 0), ("pages", pages, self.scratch_page),
            ("offsets", offsets, 0), ("kv_lens", kv_lens, 1),
        ):  # fmt: skip
            a = f[name][0]
            st[a : a + bs] = values
            st[a + bs : a + size] = pad
        tables = st[5 * n :].reshape(n, self.max_pages)
        for i, pl in enumerate(page_lists):
            tables[i, : len(pl)] = pl
        used = 5 * n + size * self.max_pages
        first = n if ids_on_device else 0  # keep the ids the previous graph wrote
        self.meta[first:used].copy_(staging[first:used], non_blocking=True)
        self.graphs[key].replay()
        return self.graph_logits[key][:bs]


def make_forecast(model, sparse):
    """The Forecast predictor a sparse config asks for (None: no prefetch)."""
    from engine.kv import forecast

    if sparse.forecast == "free":
        return forecast.TrainingFreeForecast(model)
    if sparse.forecast == "trained":
        path = sparse.forecast_weights or forecast.default_weights_path(model)
        if path is None:
            import warnings

            warnings.warn("no Forecast weights for this model; using the training-free "
                          "predictor", RuntimeWarning, stacklevel=2)  # fmt: skip
            return forecast.TrainingFreeForecast(model)
        return forecast.load_forecast(model, path)
    return None


def key_size(key: int | tuple) -> int:
    return key if isinstance(key, int) else key[0]
