"""Runs one scheduled step on the model: builds the step's tensors, runs the forward pass
(through a captured CUDA graph for decode batches on GPU, engine.runtime.decode_graphs, and
for verifications with the tiered cache, engine.runtime.verify_graphs), and samples."""

from __future__ import annotations

import time

import torch

from engine.config import EngineConfig, ModelConfig
from engine.errors import StepCancelled
from engine.kv.dense_kv import DenseKV
from engine.kv.pool import KVCache
from engine.layers.attention import per_query_tables
from engine.layers.rope import RotaryEmbedding
from engine.layers.sampler import sample
from engine.layers.step_context import StepContext
from engine.models.causal_lm import CausalLM
from engine.runtime.decode_graphs import DecodeGraphs
from engine.runtime.graph_setup import GraphSetup, graph_sizes
from engine.runtime.scheduler import SchedulerOutput
from engine.runtime.step_inputs import StepInputs, StepShape, prepare
from engine.runtime.verify_graphs import VerifyGraphs
from engine.runtime.verify_rows import VerifyRowGraphs
from kernels.fp8 import FP8


class ModelRunner:
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
        kv_dtype = FP8 if engine_cfg.kv_dtype == "fp8" else dtype
        self.kv = KVCache(cfg, num_pages + 1, self.page_size, kv_dtype, device, pinned=host_tier)
        self.scratch_page = num_pages
        self.rope = RotaryEmbedding(cfg, max_model_len, device, dtype)
        self.generators: dict[int, torch.Generator] = {}
        self.prefill_attn_dtype: torch.dtype | None = None
        # CPU attention reads a contiguous per-sequence copy instead of gathering pages
        # (not over an fp8 pool: attention then reads the rounded rows the pool holds)
        self.use_dense_kv = device.type == "cpu" and engine_cfg.cpu_dense_kv and kv_dtype != FP8
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
        sp = engine_cfg.sparse
        use_graphs = (
            engine_cfg.cuda_graphs
            and device.type == "cuda"
            and cfg.rope_type != "dynamic"
            # the stochastic tail goes back to the host each step
            and not (sp is not None and sp.tail_pages)
        )
        # CUDA graphs (None: not on this device or config): decode steps; verifications
        # with the tiered cache only, on when EngineConfig.verify_graphs says so
        self.graph_setup: GraphSetup | None = None
        self.decode_graphs: DecodeGraphs | None = None
        self.verify_graphs: VerifyGraphs | None = None
        # verifications without the tiered cache, in graphs (made at the first one)
        self.verify_rows: VerifyRowGraphs | None = None
        self.verify_rows_on = engine_cfg.verify_graphs
        if use_graphs:
            self.graph_setup = setup = GraphSetup(
                model=model,
                rope=self.rope,
                kv=self.kv,
                tiers=self.tiers,
                device=device,
                page_size=self.page_size,
                max_pages=self.max_pages,
                scratch_page=self.scratch_page,
                sizes=graph_sizes(engine_cfg.max_num_seqs),
                sliding_window=cfg.sliding_window,
            )
            if self.tiers is not None:
                self.verify_graphs = VerifyGraphs(setup, enabled=engine_cfg.verify_graphs)
            self.decode_graphs = DecodeGraphs(setup)  # (captures its graphs without tiers)

    def _to_device(self, values: list[int], dtype=torch.long) -> torch.Tensor:
        t = torch.tensor(values, dtype=dtype)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def prepare(self, out: SchedulerOutput, ahead: bool = False) -> StepInputs:
        """The step's host-side inputs (engine.runtime.step_inputs.prepare)."""
        return prepare(out, self.page_size, ahead)

    # -- execution -----------------------------------------------------------------------

    @torch.inference_mode()
    def graph_eligible(self, out: SchedulerOutput) -> bool:
        """A greedy decode batch that a captured graph serves, argmax included (its KV
        lengths counted one further: the step may be the one launched ahead)."""
        items = out.scheduled
        shape = StepShape([it.num_tokens for it in items], [len(it.seq) + 1 for it in items])
        return (
            self.decode_graphs is not None
            and all(it.samples and it.seq.params.plain_greedy for it in items)
            and self.decode_graphs.eligible(shape)
        )

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, ahead: bool = False) -> tuple:
        """Start a graph-eligible step on the device without waiting for it."""
        seq_ids = [it.seq.seq_id for it in out.scheduled]
        return self.decode_graphs.launch(self.prepare(out, ahead), seq_ids, ahead)

    def collect(self, handle: tuple) -> dict[int, int]:
        return self.decode_graphs.collect(handle)

    @torch.inference_mode()
    def run(self, out: SchedulerOutput, stop=None) -> dict[int, int]:
        """Run one step; returns the sampled token for each sequence that samples. `stop`
        (a callable): where it says so between two layers of a prefill on the CPU, the step
        ends there with StepCancelled (its KV writes land in pages nobody will read)."""
        if self.graph_eligible(out):
            return self.collect(self.launch(out))
        t0 = time.perf_counter()
        prefetched = self.tiers is not None and self.tiers.prefetching()
        batch = self.prepare(out)
        sampling = [item for item in out.scheduled if item.samples]
        params = [item.seq.params for item in sampling]
        if self.decode_graphs is not None and self.decode_graphs.eligible(batch):
            logits = self.decode_graphs.replay(batch)
        else:
            hidden = self.eager_hidden(batch, self._dense_kv_for(out), stop=stop)
            logits = self.model.compute_logits(hidden[self._to_device(batch.sample_idx)])
        gens = [self._generator(item.seq) for item in sampling]
        generated = [item.seq.completion_token_ids for item in sampling]
        tokens = sample(logits[: len(sampling)].float(), params, gens, generated)
        if self.tiers is not None and all(q == 1 for q in batch.query_lens):  # decode steps only
            self.tiers.policy.read(wait=True)  # (the tokens are on the host: the step is done)
            ms = 1000 * (time.perf_counter() - t0)
            self.tiers.policy.update(0, ms, prefetched, len(batch.query_lens))
        return {item.seq.seq_id: tok for item, tok in zip(sampling, tokens, strict=True)}

    @torch.inference_mode()
    def verify(self, out: SchedulerOutput) -> torch.Tensor:
        """A verification step: every scheduled sequence runs its last token and its draft
        (the same count each); returns the logits at every position [B, k+1, V]. With the
        tiered cache the k+1 queries share one fetch, and the rows fold into the summaries
        only when `after_verify` says which were accepted."""
        batch = self.prepare(out)
        B, T = batch.batch_size, batch.query_lens[0]
        assert len(set(batch.query_lens)) == 1, "a verification runs k+1 positions per sequence"
        if self.verify_graphs is not None and self.verify_graphs.eligible(batch):
            # (a sequence's pages up to its last computed token stay as they are)
            logits = self.verify_graphs.replay(batch)
            if logits is not None:
                return logits.view(B, T, -1)
        if (
            self.verify_rows is None
            and self.tiers is None
            and self.graph_setup is not None
            and self.verify_rows_on
        ):
            self.verify_rows = VerifyRowGraphs(self.graph_setup, self.cfg.num_kv_heads)
        if self.verify_rows is not None and self.verify_rows.eligible(batch, T):
            return self.verify_rows.replay(batch, T).view(B, T, -1)
        if self.tiers is not None:
            self.tiers.defer_summaries = True
        try:
            hidden = self.eager_hidden(batch, self._dense_kv_for(out), verify=True)
        finally:
            if self.tiers is not None:
                self.tiers.defer_summaries = False
        logits = self.model.compute_logits(hidden, exact=True)
        return logits.view(B, T, -1)

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
        self, batch: StepInputs, dense_kv: list | None = None, verify: bool = False, stop=None
    ) -> torch.Tensor:
        """Forward pass without CUDA graphs: final hidden states [T, hidden]. verify: the
        step is a verification (k+1 query tokens per sequence: sparse over the tiers). stop:
        as for run."""
        b = batch
        ctx = StepContext(
            page_size=self.page_size,
            slot_pages=self._to_device(b.pages),
            slot_offsets=self._to_device(b.offsets),
            query_lens=b.query_lens,
            kv_lens=b.kv_lens,
            page_lists=[self._to_device(p) for p in b.page_lists],
            sliding_window=self.cfg.sliding_window,
            prefill_attn_dtype=None if verify else self.prefill_attn_dtype,
            dense_kv=dense_kv,
            verify=verify,
        )
        ctx.cos, ctx.sin = self.rope(
            self._to_device(b.positions), b.rope_lens if self.rope.dynamic else None
        )
        n = b.query_lens[0]
        decode = (n == 1 or verify) and all(q == n for q in b.query_lens)  # decode or verify
        if stop is not None and not decode and self.device.type == "cpu":
            ctx.layer_hook = _stop_check(stop)  # a chunk takes seconds there: check each layer
        if self.tiers is not None:
            ctx.tiers = self.tiers
            self.tiers.end_step(max(b.kv_lens))
            if decode:
                width = max(len(p) for p in b.page_lists)
                tables = [list(p) + [0] * (width - len(p)) for p in b.page_lists]
                ctx.tier_tables = self._to_device(tables, torch.int32).view(len(tables), width)
                ctx.tier_lens = self._to_device(b.kv_lens, torch.int32)
        elif verify and decode and self.device.type == "cuda":
            self._verify_tables(ctx, b, n)
        return self.model(self._to_device(b.ids), self.kv.layers, ctx)

    def _verify_tables(self, ctx: StepContext, b: StepInputs, T: int) -> None:
        """A verification on the GPU without the tiered cache: each of its B * T queries
        attends as one decode row (the paged decode kernel), with its sequence's pages and
        its own length, split as the decode step of B sequences splits (so a query sums in
        the order its plain decode step would, not a gather of the whole context for
        per-head SDPA: 40-65 ms a verification of Qwen2.5-Coder-0.5B at 26K tokens)."""
        from kernels.paged_decode import default_num_splits

        w = self.cfg.sliding_window
        if w is not None and max(b.kv_lens) > w:
            return
        rows, lens = per_query_tables(b.page_lists, b.kv_lens, T)
        ctx.block_tables = self._to_device(rows, torch.int32).view(len(rows), -1)
        ctx.kv_lens_t = self._to_device(lens, torch.int32)
        B = len(b.kv_lens)
        size = self.graph_setup.size_for(B) if self.decode_graphs is not None else None
        ctx.attn_splits = default_num_splits(size or B, self.cfg.num_kv_heads, self.device)

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

    def reset_graphs(self) -> None:
        """Drop the captured decode and verification graphs of the tiered cache (they are
        captured again when needed), e.g. after its selection settings change."""
        if self.tiers is not None and self.decode_graphs is not None:
            torch.cuda.synchronize()
            self.decode_graphs.reset()
            self.graph_setup.pool = None  # a pool whose graphs are all gone cannot be reused
            self.verify_graphs.reset()


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


def _stop_check(stop):
    def check(layer: int) -> None:
        if stop():
            raise StepCancelled(f"cancelled after layer {layer}")

    return check
