"""The tiered KV cache: a full host copy, a GPU working set of page slots, sparse decode.

Tiers:
- host tier: the paged pool [layers, pages, kv_heads, 2, P, D] that every K/V row is
  written to (write-through: nothing is lost when a slot is dropped). On a GPU machine it is
  meant to live in pinned host memory; on the CPU it is ordinary memory.
- GPU tier: per layer, a pool of `num_slots` page units [2, P, D] under a byte budget, and
  a page table `slot_of[layer, unit]` (unit = page * kv_heads + head; -1 = not resident).
  It holds the protected working set (this step's selected pages, which include the sinks
  and the local window) and, while room lasts, any other pages it held before (optional
  residency); those are shed first, least valuable first (recency, then how often they were
  selected), whenever the working set needs room.
- page summaries: per layer, beside the GPU tier, updated on every append: Quest's min and
  max of the page's keys in the keys' dtype, or the sum of its keys in fp32 for mean-key
  scoring (kernels.page_score.summary_rows).

Decode attention of a layer (every sequence of the step with one new token, or T tokens of
a verification): score each (sequence, KV head)'s pages from the summaries with the GQA
group pooled, select sinks + window + top-k (+ an optional stochastic tail; or the oracle's
exact attention mass), fetch the selected pages that have no slot from the host, then run
the sparse decode kernel over the slots. The result is exactly sparse attention over the
selected pages. One selection may serve a group of consecutive layers.

Verification (speculative decoding, engine.spec): the T = k+1 queries of a sequence each
select their own pages (each with its own length, window and budget, as if decoded one by
one), the union is fetched once, and the kernel masks each query to its own pages, so the
result is what T single-token steps would compute, at the cost of one fetch. The rows of a
verification fold into the summaries only once accepted (`fold_rows`); pages of rejected
positions leave the page table and the GPU tier (`drop_pages`).

Forecast prefetch (engine.kv.forecast): after layer l's attention, `after_attention`
predicts layer l+1's selection from the residual stream and copies its missing pages from
the host into a stage on the device (on a side stream on a GPU). Layer l+1 selects exactly
and allocates its slots meanwhile, waits for the prefetch only at its fetch, and then fills
its missing slots from the stage where the prediction got them, from the host otherwise.
The prefetch never touches the slots or the page table, so nothing else waits for it.
Counters: recall of the prediction, prefetch hits, waste, and the fetches left on the
critical path.

Everything in a decode step runs on the device with fixed shapes (slot allocation and
eviction included), so the step can be captured in a CUDA graph.

Prefill stays dense and exact (engine.attention); its rows go to the host tier and the
summaries like any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.kv.prefetch_policy import PrefetchTrials
from kernels.kv_append import fold_summaries, tier_append
from kernels.page_score import (
    count_recall,
    empty_summaries,
    page_scores,
    select_pages,
    summary_rows,
)
from kernels.page_union import union_pages
from kernels.sparse_decode import sparse_decode_attention
from kernels.synthetic_select import synthetic_query_scores
from kernels.tier_alloc import NO_CLAIM, LayerState, allocate
from kernels.uva_gather import NOT_STAGED, stage_pages


@dataclass
class SparseConfig:
    """Sparse attention and the GPU tier. Budgets: `budget_tokens` or `budget_fraction`
    of each sequence's pages (the larger wins when both are set), never fewer than the
    sinks + window + 1 pages."""

    budget_tokens: int | None = None
    budget_fraction: float | None = None
    sink_pages: int = 1
    window_pages: int = 2
    summary: str = "quest"  # "quest" (min/max bound) or "mean" (mean key)
    tail_pages: int = 0  # stochastic tail: extra pages sampled in proportion to exp(score)
    oracle: bool = False  # exact attention mass per page (evaluation only: reads every page)
    layer_group: int = 1  # consecutive layers that share one selection
    # benchmarks with dummy weights only: random selections that keep each page read at the
    # step before with this probability (0: fresh random pages every step, the worst case)
    synthetic: float | None = None
    # ... and of the pages a step does not keep, this share is drawn from pages the row read
    # at earlier steps (which a GPU tier that keeps used pages still holds); the default
    # model's selections measured 0.86-0.89 (bench.page_recurrence, docs/quality.md); 0:
    # every new page at random (the "realistic" benchmarks before that measurement)
    synthetic_recurring: float = 0.0
    # benchmarks with synthetic selections and a forecast: the simulated predictor's recall
    # (each page of the next layer's selection is predicted with this probability; 1.0 is
    # the oracle prefetch; the training-free predictor measured 0.92-0.93, docs/quality.md)
    synthetic_recall: float = 1.0
    # Forecast prefetch (engine.kv.forecast): "off", "free" (training-free predictor) or
    # "trained" (the weights file `forecast_weights`, by default the one shipped for the
    # model; a missing or mismatched file falls back to "free" with a warning)
    forecast: str = "off"
    forecast_weights: str | None = None
    # the prefetch's gather runs beside the main stream's work on this many programs (one
    # per SM at most; None: the demand gather's default, 16 on a GPU): fewer leave more of
    # the GPU to the work it overlaps
    prefetch_programs: int | None = None
    # the prefetch's stream at the GPU's highest priority: its chain (prediction, selection,
    # staging) is what the main stream waits for, and beside the main stream's GEMMs its
    # selection ran at half speed (an H200 profile); False: default priority
    prefetch_high_priority: bool = False
    # "always": prefetch at every step (with a forecast); "auto": only while the steps need
    # many pages from the host: on once the pages a layer fetches per step (on demand or
    # staged) pass `prefetch_on_mib`, off again below `prefetch_off_mib` (moving average
    # over steps). On the H200 at 128K the prefetch paid with ~7.5 MB per layer-step (worst
    # case: 1.09x) and cost 10% with ~1.1 MB (the realistic case), docs/benchmarks.md
    # "timed" (engine.kv.prefetch_policy): while "auto" would prefetch, time steps both ways
    # now and then and keep the faster (the agentctx command line's choice)
    prefetch_policy: str = "always"
    prefetch_on_mib: float = 4.0
    prefetch_off_mib: float = 2.0
    trial_steps: int = 8
    retrial_steps: int = 512
    # evaluation only: each layer past the first reads the Forecast's predicted pages instead
    # of its exact selection (how good the prediction is on its own, with no correction)
    forecast_only: bool = False
    # evaluation only: keep all three summary rows so `summary` can be switched at run time
    keep_all_summaries: bool = False
    gpu_kv_budget: int | None = None  # bytes for the GPU slot pools; None: room for all pages
    # benchmarks only: a verification fetches each query's missing pages in turn (False)
    # instead of the union once (True, the engine's way)
    verify_shared_fetch: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.budget_tokens is None and self.budget_fraction is None:
            raise ValueError("set budget_tokens or budget_fraction")
        if self.budget_tokens is not None and not 0 < self.budget_tokens <= 1 << 40:
            raise ValueError(f"budget_tokens must be in [1, 2^40], got {self.budget_tokens}")
        if self.budget_fraction is not None and not 0 < self.budget_fraction <= 1:
            raise ValueError(f"budget_fraction must be in (0, 1], got {self.budget_fraction}")
        if self.summary not in ("quest", "mean"):
            raise ValueError(f"summary must be quest or mean, got {self.summary!r}")
        if self.layer_group < 1 or self.sink_pages < 0 or self.window_pages < 1:
            raise ValueError("layer_group >= 1, sink_pages >= 0 and window_pages >= 1")
        if self.prefetch_policy not in ("always", "auto", "timed"):
            raise ValueError(
                f"prefetch_policy must be always, auto or timed, got {self.prefetch_policy!r}"
            )
        if self.trial_steps < 1 or self.retrial_steps < 1:
            raise ValueError("trial_steps >= 1 and retrial_steps >= 1")
        if not 0 <= self.prefetch_off_mib <= self.prefetch_on_mib:
            raise ValueError("0 <= prefetch_off_mib <= prefetch_on_mib")
        if self.forecast not in ("off", "free", "trained"):
            raise ValueError(f"forecast must be off, free or trained, got {self.forecast!r}")
        if self.forecast_only and (self.forecast == "off" or self.prefetch_policy != "always"):
            raise ValueError("forecast_only needs a forecast at every step")

    def budget_pages(self, n_pages: int, page_size: int) -> int:
        want = 0
        if self.budget_tokens is not None:
            want = -(-self.budget_tokens // page_size)
        if self.budget_fraction is not None:
            want = max(want, math.ceil(self.budget_fraction * n_pages))
        return max(want, self.sink_pages + self.window_pages + 1)


_COUNTERS = ("steps", "selected", "max_selected", "fetched", "evicted", "locality_hits",
             "locality_total", "demand_fetched", "prefetched", "prefetch_hits", "prefetch_waste",
             "recall_hits", "recall_total", "dropped")  # fmt: skip
_C = {name: i for i, name in enumerate(_COUNTERS)}


@dataclass
class TierStats:
    """Counters since the last reset (engine.tier_stats())."""

    steps: int = 0  # sparse decode layer-steps
    selected: int = 0  # (sequence, head, page) selections
    fetched: int = 0  # of those, fetched from the host (missing on the GPU)
    fetched_bytes: int = 0
    evicted: int = 0
    max_selected: int = 0  # the most (sequence, head, page) selections of one layer-step
    # page-selection locality: of the pages selected at a layer, how many that layer had
    # selected at the step before (for the same sequence slot and head)
    locality_hits: int = 0
    locality_total: int = 0
    # Forecast prefetch: pages fetched at attention time (on the critical path) and ahead of
    # it; prefetched pages the exact selection then read (hits) or did not (waste); recall
    # of the predicted selections against the exact ones
    demand_fetched: int = 0
    prefetched: int = 0
    prefetch_hits: int = 0
    prefetch_waste: int = 0
    recall_hits: int = 0
    recall_total: int = 0
    dropped: int = 0  # slots freed because their page left its sequence (rolled back)

    @property
    def recall(self) -> float:
        return self.recall_hits / self.recall_total if self.recall_total else 0.0

    @property
    def locality(self) -> float:
        return self.locality_hits / self.locality_total if self.locality_total else 0.0

    @property
    def fetch_fraction(self) -> float:
        return self.fetched / self.selected if self.selected else 0.0


class TieredKV:
    def __init__(self, cfg, host_pool: torch.Tensor, page_size: int, sparse: SparseConfig,
                 device: torch.device) -> None:  # fmt: skip
        self.sparse = sparse
        self.L, self.num_pages, self.Hkv, _, self.P, self.D = host_pool.shape
        self.host = host_pool
        self.host_units = [layer.view(-1, 2, self.P, self.D) for layer in host_pool.unbind(0)]
        self.device = device
        self.unit_bytes = 2 * self.P * self.D * host_pool.element_size()
        units = self.num_pages * self.Hkv
        if sparse.gpu_kv_budget is None:
            self.num_slots = units
        else:
            self.num_slots = max(1, sparse.gpu_kv_budget // (self.L * self.unit_bytes))
        # One scratch entry past the end of the slots, the page table and the summaries
        # takes the writes of rows that have no slot and the reads of unused selection
        # entries, so that a decode step needs no host round trip (and can be a CUDA graph).
        # slot_of[layer, unit]: the unit's slot or -1; unit_in[layer, slot]: the slot's unit
        # or -1 (free). The scratch unit always sits in the scratch slot.
        self.scratch_slot, self.scratch_unit = self.num_slots, units
        self.slots = torch.zeros(
            self.L, self.num_slots + 1, 2, self.P, self.D, dtype=host_pool.dtype, device=device
        )
        self.slot_of = torch.full((self.L, units + 1), -1, dtype=torch.int32, device=device)
        self.slot_of[:, self.scratch_unit] = self.scratch_slot
        self.unit_in = torch.full((self.L, self.num_slots + 1), -1, dtype=torch.long, device=device)
        self.unit_in[:, self.scratch_slot] = self.scratch_unit
        # eviction value: the step a slot was last read at (-1: free), then its read count
        self.last_used = torch.full((self.L, self.num_slots + 1), -1, dtype=torch.long,
                                    device=device)  # fmt: skip
        self.uses = torch.zeros(self.L, self.num_slots + 1, dtype=torch.long, device=device)
        # which entry of a call owns a unit listed twice (the first: kernels.tier_alloc)
        self._claim = torch.full((units + 1,), NO_CLAIM, dtype=torch.long, device=device)
        mode = None if sparse.oracle or sparse.keep_all_summaries else sparse.summary
        # one allocation for every layer (at 500K tokens: 3.8 GiB of Quest summaries)
        summ = empty_summaries(self.L * (units + 1), self.D, device, mode=mode,
                               dtype=host_pool.dtype)  # fmt: skip
        self.summ = summ.view(self.L, units + 1, *summ.shape[1:])
        self.rows = summary_rows(mode)
        self.clock = torch.zeros((), dtype=torch.long, device=device)  # decode steps
        # device-side counters, read when `stats` is asked for: see _COUNTERS
        self._acc = torch.zeros(len(_COUNTERS), dtype=torch.long, device=device)
        self._group_selection: tuple | None = None
        self.step_budget: int | None = None
        # Forecast: the predictor (set by the model runner), each layer's predicted page
        # ids, and the side stream on a GPU
        self.forecast = None
        self._predicted: dict[int, tuple[torch.Tensor, ...]] = {}
        self._recall_mark: torch.Tensor | None = None  # count_recall's scratch (zeros)
        self._recall_marks_old: list = []  # earlier, smaller ones (captured graphs use them)
        self._union_bits: torch.Tensor | None = None  # a verification union's bitmap (zeros)
        self._union_bits_old: list = []
        # a verification's query lengths and budgets (layer 0 computes them for the step)
        self._per_query: tuple | None = None
        self._synthetic_next: dict[int, torch.Tensor] = {}
        self._synth_prev: dict[tuple[int, int], torch.Tensor] = {}
        self._pending: dict[int, torch.cuda.Event | None] = {}
        # the prefetch's stage: rows of units copied ahead to the device, and per unit its
        # row (NOT_STAGED: none; one table for every layer, reset once a layer's step has
        # used it); `_staged[layer]`: the units a pending prefetch listed
        self.stage: torch.Tensor | None = None
        self.stage_of = torch.full((units + 1,), NOT_STAGED, dtype=torch.int32, device=device)
        self._staged: dict[int, torch.Tensor] = {}
        self.recall_by_layer = torch.zeros(self.L, 2, dtype=torch.long, device=device)
        self._side = torch.cuda.Stream(device) if device.type == "cuda" else None
        # the same at the highest priority (SparseConfig.prefetch_high_priority): the GPU
        # then starts the prefetch's blocks before the main stream's waiting ones
        # (torch maps a priority past the device's range to its highest)
        self._side_high = (torch.cuda.Stream(device, priority=-100)
                           if device.type == "cuda" else None)  # fmt: skip
        # the prefetch reads which units are resident from a copy taken before it forks: the
        # main stream's allocation for the same layer runs beside it and marks the units it
        # is about to fetch resident, which left them unstaged (only 30% of a 500K worst
        # case's pages were staged); two copies, for consecutive layers
        self._resident = (torch.empty(2, units + 1, dtype=torch.int32, device=device)
                          if self._side is not None else None)  # fmt: skip
        # the "auto" prefetch policy: whether the next steps prefetch, what the last steps
        # needed from the host (MiB per layer-step, a moving average), and the counters it
        # last read (steps, demand fetches, prefetch hits: a pinned copy read after a step)
        self.prefetch_on = sparse.prefetch_policy == "always"
        self.need_mib: float | None = None
        self.need_high = False  # "timed": the steps need the host (auto's hysteresis)
        self.trials = PrefetchTrials(sparse.trial_steps, retrial_steps=sparse.retrial_steps)
        self._policy_seen = (0, 0, 0)
        self._policy_host = torch.zeros(
            2, 3, dtype=torch.long, pin_memory=device.type == "cuda"
        )  # (per token turn)
        self._policy_idx = torch.tensor([_C["steps"], _C["demand_fetched"], _C["prefetch_hits"]],
                                        device=device)  # fmt: skip
        self._gen = torch.Generator(device=device).manual_seed(sparse.seed)
        # a verification's rows fold into the summaries only once accepted (fold_rows)
        self.defer_summaries = False
        self._seq_budgets: tuple | None = None  # (lengths tensor, step budget, budgets)
        # a verification in a CUDA graph lists each union in a fixed width; a union that
        # does not fit sets `verify_overflow` (the caller then verifies again eagerly)
        self.verify_width: int | None = None
        self.verify_overflow = torch.zeros((), dtype=torch.int32, device=device)

    # -- sizes for the meter ----------------------------------------------------------------

    def resident_units(self) -> int:
        return int((self.unit_in[:, : self.num_slots] >= 0).sum())

    @property
    def stats(self) -> TierStats:
        """The counters (reading them waits for the device)."""
        c = dict(zip(_COUNTERS, self._acc.tolist(), strict=True))
        return TierStats(**c, fetched_bytes=c["fetched"] * self.unit_bytes)

    def reset_stats(self) -> None:
        self._acc.zero_()
        self._policy_seen = (0, 0, 0)  # (the "auto" policy's last reading: before the reset)
        self._policy_host.zero_()
        self.recall_by_layer.zero_()
        for stale in self._staged.values():
            self.stage_of.index_fill_(0, stale, NOT_STAGED)
        self._staged.clear()
        self._predicted.clear()
        self._synthetic_next.clear()

    # -- appends ----------------------------------------------------------------------------

    def after_append(self, layer: int, k: torch.Tensor, v: torch.Tensor, pages: torch.Tensor,
                     offsets: torch.Tensor, distinct: bool = False) -> None:  # fmt: skip
        """The step's rows are in the host pool (k, v [T, Hkv, D] at pages/offsets): fold
        their keys into the summaries and write them to any slot their page has. A page
        whose first row is written is a fresh page: its summary starts again. (Its slot, if
        it has one, stays: it still holds that page of that head, and rows are written in
        order, so every row a query can see is fresh.) No host round trip. `distinct`: the
        rows fall in distinct pages (a decode step), so one kernel does it all on a GPU.
        (No wait for a pending prefetch: it never writes the slots, the page table or the
        summaries, and it leaves out the pages these rows go to.)"""
        fold = not self.defer_summaries
        tier_append(k, v, self.slots[layer], self.slot_of[layer], self.summ[layer],
                    pages.to(self.device), offsets.to(self.device), self.rows, fold,
                    use_triton=None if (distinct or not fold) else False)  # fmt: skip

    def fold_rows(self, pages: list[int], offsets: list[int]) -> None:
        """Fold rows already in the host tier (a verification's accepted positions, in
        order) into every layer's summaries, all layers in one pass."""
        if not pages:
            return
        L, Hkv, D, dev = self.L, self.Hkv, self.D, self.device
        pg, off = torch.tensor(pages), torch.tensor(offsets)
        k = self.host[:, pg, :, 0, off].transpose(0, 1)  # [L, T, Hkv, D]
        per_layer = self.summ.shape[1]  # units + the scratch unit
        base = torch.arange(L, device=dev)[:, None] * per_layer
        units = (pg.to(dev)[:, None] * Hkv + torch.arange(Hkv, device=dev)).reshape(1, -1)
        fresh = (off.to(dev) == 0)[:, None].expand(-1, Hkv).reshape(1, -1).expand(L, -1)
        summ = self.summ.view(L * per_layer, *self.summ.shape[2:])
        fold_summaries(summ, k.reshape(-1, D), (base + units).reshape(-1), fresh.reshape(-1),
                       (base + self.scratch_unit).expand(L, units.shape[1]).reshape(-1),
                       self.rows)  # fmt: skip

    def drop_pages(self, pages: list[int]) -> None:
        """Pages that left their sequence (rolled back): free their slots in every layer,
        all layers in one pass."""
        if not pages:
            return
        pg = torch.tensor(pages, device=self.device)
        units = (pg[:, None] * self.Hkv + torch.arange(self.Hkv, device=self.device)).reshape(-1)
        slot = self.slot_of[:, units].long()  # [L, n]
        self._acc[_C["dropped"]] += (slot >= 0).sum()
        s = torch.where(slot >= 0, slot, self.scratch_slot)
        self.unit_in.scatter_(1, s, -1)
        self.last_used.scatter_(1, s, -1)
        self.uses.scatter_(1, s, 0)
        self.slot_of.index_fill_(1, units, -1)
        self.unit_in[:, self.scratch_slot].fill_(self.scratch_unit)

    # -- sparse decode ----------------------------------------------------------------------

    def attend(self, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
               kv_lens: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
        """q [B, T, Hq, D] (the last T positions of each sequence) -> [B, T, Hq, D]. Runs
        on the device only (no host round trip), so a decode step can be a CUDA graph."""
        B, T, Hq, D = q.shape
        sp, Hkv = self.sparse, self.Hkv
        if layer == 0:
            self.clock += 1
        predicted = self._predicted.pop(layer, None)
        if sp.forecast_only:  # the prediction is the selection: wait for it now
            self._join(layer)
        if sp.forecast_only and predicted is not None:
            self._group_selection = predicted + (None,)
        elif layer % sp.layer_group == 0 or self._group_selection is None:
            if T > 1 and not sp.oracle:
                self._group_selection = self._select_per_query(q, layer, block_tables, kv_lens,
                                                               self.verify_width)  # fmt: skip
            else:
                self._group_selection = self._select(layer, q, block_tables, kv_lens, scale) + (
                    None,
                )
        pages, counts, qmask = self._group_selection
        width = pages.shape[-1]
        if B * Hkv * width > self.num_slots:
            from engine.errors import CacheFullError

            raise CacheFullError(
                f"the GPU KV budget holds {self.num_slots} pages per layer, fewer than this "
                f"step's {B * Hkv * width} selected pages: raise --gpu-kv-budget or lower the "
                "sparse budget"
            )
        # the units the step reads, and their slots (fetching what is missing)
        page_ids = torch.gather(block_tables.long(), 1, pages.reshape(B, -1).long())
        units = page_ids.view(B, Hkv, -1) * Hkv + torch.arange(Hkv, device=q.device)[None, :, None]
        valid = torch.arange(width, device=q.device)[None, None, :] < counts[..., None]
        if qmask is not None and not sp.verify_shared_fetch:  # the per-query way (benchmarks)
            for t in range(T):
                mine = valid & (((qmask >> t) & 1) != 0)
                self._ensure_resident(layer, units.reshape(-1), mine.reshape(-1))
        slots = self._ensure_resident(layer, units.reshape(-1), valid.reshape(-1))
        if predicted is not None and not sp.forecast_only:  # recall@k (after the prefetch's wait)
            M = block_tables.shape[1]
            if self._recall_mark is None or self._recall_mark.numel() < B * Hkv * M:
                # (a graph captured with the old scratch still writes it: keep it alive)
                self._recall_marks_old.append(self._recall_mark)
                self._recall_mark = torch.zeros(B * Hkv * M, dtype=torch.int8, device=q.device)
            count_recall(pages, valid, *predicted, M, self._acc,
                         _C["recall_hits"], _C["recall_total"], self.recall_by_layer, layer,
                         self._recall_mark)  # fmt: skip
        out = sparse_decode_attention(
            q.contiguous(), self.slots[layer], slots.view(B, Hkv, width), pages.to(torch.int32),
            counts, kv_lens.to(torch.int32), scale, qmask=qmask,
        )  # fmt: skip
        n_sel = counts.sum()
        acc = self._acc
        acc[_C["selected"]] += n_sel
        acc[_C["max_selected"]] = torch.maximum(acc[_C["max_selected"]], n_sel)
        acc[_C["steps"]] += 1
        return out

    def _select(self, layer, q, block_tables, kv_lens, scale,
                scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Scores of every page of each (sequence, KV head) for queries q (or the given
        scores), then the selection (pages [B, Hkv, budget], counts [B, Hkv])."""
        sp, P, Hkv = self.sparse, self.P, self.Hkv
        budget = self.step_budget
        if budget is None:  # a device read: callers say the step's length in end_step
            budget = self.budget_for(int(kv_lens.max()), block_tables.shape[1])
        budget = min(budget, block_tables.shape[1])
        record = False
        if scores is not None:
            pass
        elif sp.oracle:
            scores = self._oracle_scores(layer, q, block_tables, kv_lens, scale)
        elif sp.synthetic is not None:
            # drawn ahead by a synthetic forecast, or now
            scores = self._synthetic_next.pop(layer, None)
            if scores is None:
                scores = self._synthetic_scores(layer, block_tables)
            record = True
        else:
            scores = page_scores(q, self.summ[layer], block_tables, kv_lens, P, Hkv, sp.summary)
        # each sequence's own budget (the step's is the longest one's): its pages do not
        # depend on what else is in the batch; computed once per step (every layer and the
        # prefetch get the same lengths tensor)
        cached = self._seq_budgets
        if cached is not None and cached[0] is kv_lens and cached[1] == budget:
            budgets = cached[2]
        else:
            budgets = self._budget_pages((kv_lens.long() + P - 1) // P).clamp(max=budget)
            self._seq_budgets = (kv_lens, budget, budgets)
        pages, counts = select_pages(
            scores, kv_lens, P, budget, sp.sink_pages, sp.window_pages, sp.tail_pages,
            generator=self._gen if sp.tail_pages else None,
            width=None if sp.tail_pages else budget, budgets=budgets,
        )  # fmt: skip
        if record:  # what each row read, for the next step's synthetic locality
            valid = torch.arange(pages.shape[-1], device=pages.device) < counts[..., None]
            self._synthetic_record(layer, block_tables.shape[0], pages[:, None], valid[:, None])
        return pages, counts

    def _synthetic_record(self, layer: int, B: int, pages: torch.Tensor,
                          valid: torch.Tensor) -> None:  # fmt: skip
        """What each row read at this step (pages, valid [B, T, Hkv, W]: T queries), for the
        next step's synthetic locality: the last query's pages; and every query's among the
        pages read at any step (the recurring draws')."""
        prev = self._synthetic_prev(layer, B)
        none = prev.shape[-1] - 1
        prev.zero_()
        prev.scatter_(-1, torch.where(valid[:, -1], pages[:, -1].long(), none), True)
        if self.sparse.synthetic_recurring:
            seen = self._synthetic_prev(layer, B, seen=True)
            at = torch.where(valid, pages.long(), none).transpose(1, 2).reshape(B, self.Hkv, -1)
            seen.scatter_(-1, at, True)
            seen[..., none] = False

    def _select_per_query(self, q, layer, block_tables, kv_lens, width: int | None = None):
        """A verification's selection: each of the T queries of a sequence selects as a
        single-token step at its own position would (its own length, window and budget),
        and the union is listed once with a bit per query (pages [B, Hkv, W] ascending,
        counts [B, Hkv], qmask [B, Hkv, W] int32). The T queries' scores come from one read
        of the summaries. `width`: W fixed (a CUDA graph's); None: the largest union (a
        device read)."""
        B, T, Hq, D = q.shape
        sp, P, Hkv = self.sparse, self.P, self.Hkv
        M = block_tables.shape[1]
        dev = q.device
        if layer == 0 or self._per_query is None:  # once per step: every layer's the same
            lens = (kv_lens.long()[:, None] - T + 1 + torch.arange(T, device=dev)).reshape(-1)
            budgets = self._budget_pages((lens + P - 1) // P).clamp(max=M)
            self._per_query = (lens.to(torch.int32), budgets.to(torch.int32))
        lens, budgets = self._per_query
        if sp.synthetic is not None:
            # benchmarks: query 0 draws as a decode step would; each later query keeps 85% of
            # its pages (the step-to-step locality measured on the real model)
            # (query 0's draw: the one a prefetch predicted from, if one ran)
            first = self._synthetic_next.pop(layer, None)
            if first is None:
                first = self._synthetic_scores(layer, block_tables)
            # ... and, as a decode step's, about `synthetic_recurring` of the pages that
            # replace the dropped ones were read at earlier steps: on the real model a k = 4
            # verification fetched 3.8-4.4x a one-token step, about what its 5 queries would
            # as 5 steps (bench.verify_union, docs/verify_union*.json); with those pages
            # drawn at random, the H200 bench's fetched 11x
            seen = None
            if sp.synthetic_recurring:
                seen = self._synthetic_prev(layer, B, seen=True)
            scores = synthetic_query_scores(first, T, budgets, seen, sp.synthetic_recurring,
                                            self.clock, layer)  # fmt: skip
        else:
            scores = page_scores(q, self.summ[layer], block_tables, kv_lens.to(torch.int32), P,
                                 Hkv, sp.summary, per_query=True).reshape(B * T, Hkv, M)  # fmt: skip
        top = min(int(budgets.max()), M) if self.step_budget is None else min(self.step_budget, M)
        pages, counts = select_pages(scores, lens, P, top, sp.sink_pages,
                                     sp.window_pages, width=top, budgets=budgets)  # fmt: skip
        if sp.synthetic is not None:  # the next step follows the last query (all accepted)
            valid = torch.arange(top, device=dev)[None, None, :] < counts[..., None]
            self._synthetic_record(layer, B, pages.view(B, T, Hkv, top),
                                   valid.view(B, T, Hkv, top))  # fmt: skip
        scratch = None
        if width is not None and dev.type == "cuda":
            if self._union_bits is None or self._union_bits.numel() < B * Hkv * M:
                if torch.cuda.is_current_stream_capturing():  # (its zeros would not be written)
                    raise RuntimeError("the verification's union bitmap must exist before "
                                       "capture: run the shape eagerly first")  # fmt: skip
                # (a graph captured with the old bitmap still uses it: keep it alive)
                self._union_bits_old.append(self._union_bits)
                self._union_bits = torch.zeros(B * Hkv * M, dtype=torch.int32, device=dev)
            scratch = self._union_bits
        return union_pages(pages, counts, T, M, width, self.verify_overflow, scratch)

    def _budget_pages(self, n_pages: torch.Tensor) -> torch.Tensor:
        """SparseConfig.budget_pages for a tensor of page counts."""
        sp = self.sparse
        want = torch.zeros_like(n_pages)
        if sp.budget_tokens is not None:
            want = want + -(-sp.budget_tokens // self.P)
        if sp.budget_fraction is not None:
            frac = torch.ceil(sp.budget_fraction * n_pages.double()).long()
            want = torch.maximum(want, frac)
        return want.clamp(min=sp.sink_pages + sp.window_pages + 1)

    # -- Forecast prefetch ------------------------------------------------------------------

    def prefetching(self) -> bool:
        """Whether decode steps prefetch now (a forecast, and the policy says so)."""
        sp = self.sparse
        return sp.forecast != "off" and (sp.prefetch_policy == "always" or self.prefetch_on)

    def policy_read(self, turn: int = 0, wait: bool = False) -> None:
        """Copy the counters the "auto" policy reads into the host buffer of `turn` (one per
        step in flight), after a step's kernels: queued (`wait` False: `policy_update(turn)`
        reads it once that step is known to be done, e.g. its tokens' event) or now."""
        if self.sparse.prefetch_policy != "always" and self.sparse.forecast != "off":
            self._policy_host[turn].copy_(self._acc[self._policy_idx], non_blocking=not wait)

    def policy_reset(self) -> None:
        """Forget what the policy measured (benchmarks: each run starts as a fresh engine)."""
        self.prefetch_on = self.sparse.prefetch_policy == "always"
        self.need_mib, self.need_high = None, False
        self.trials.reset()

    def policy_update(self, turn: int = 0, step_ms: float | None = None,
                      prefetched: bool = False, size: int = 1) -> None:  # fmt: skip
        """After a step that `policy_read(turn)` followed is done: the pages it needed from
        the host per layer (on demand or from the stage), into the moving average, and the
        prefetch on or off: by the thresholds (with hysteresis), and for "timed" then by
        the step times (`step_ms`, of a step that `prefetched` or not, of `size` sequences;
        engine.kv.prefetch_policy)."""
        sp = self.sparse
        if sp.prefetch_policy == "always" or sp.forecast == "off":
            return
        now = tuple(self._policy_host[turn].tolist())
        if now[0] < self._policy_seen[0]:  # the counters were reset
            self._policy_seen = (0, 0, 0)
        steps = now[0] - self._policy_seen[0]
        if steps <= 0:
            return
        units = (now[1] - self._policy_seen[1]) + (now[2] - self._policy_seen[2])
        self._policy_seen = now
        mib = units * self.unit_bytes / steps / 2**20
        self.need_mib = mib if self.need_mib is None else 0.5 * self.need_mib + 0.5 * mib
        if self.need_high and self.need_mib < sp.prefetch_off_mib:
            self.need_high = False
        elif not self.need_high and self.need_mib > sp.prefetch_on_mib:
            self.need_high = True
        if sp.prefetch_policy == "auto":
            self.prefetch_on = self.need_high
        elif not self.need_high:
            self.trials.reset()
            self.prefetch_on = False
        else:
            self.trials.observe(step_ms, prefetched, size)
            self.prefetch_on = self.trials.on

    def after_attention(self, layer: int, residual: torch.Tensor, ctx) -> None:
        """Layer `layer`'s attention is done (residual: the stream before its MLP): predict
        the next layer's selection and fetch its missing pages, on a side stream on a GPU."""
        nxt = layer + 1
        sp = self.sparse
        if not self.prefetching() or nxt >= self.L or nxt % sp.layer_group:
            return
        tables, lens = ctx.tier_tables, ctx.tier_lens
        B = tables.shape[0]
        scores = None
        if sp.synthetic is not None:
            # benchmarks (dummy weights): draw the next layer's synthetic selection now; the
            # prediction is that selection with each page kept with probability
            # `synthetic_recall` (the rest of the budget goes to other pages). (Random draws
            # stay on the main stream.)
            exact = self._synthetic_scores(nxt, tables)
            self._synthetic_next[nxt] = exact
            miss = torch.rand(exact.shape, device=self.device) >= sp.synthetic_recall
            scores = exact - 4.0 * miss.float()

        resident = None
        if self._resident is not None:
            resident = self._resident[nxt % 2]
            resident.copy_(self.slot_of[nxt])

        def predict_and_fetch() -> None:
            if scores is not None:
                q = residual.new_zeros(B, 1, 1, self.D)
            else:
                q = self.forecast.query(nxt, residual, ctx)
                q = q.view(B, q.shape[0] // B, *q.shape[1:])
            self.prefetch(nxt, q, tables, lens, scores, rows=residual.shape[0] // B,
                          resident=resident)  # fmt: skip

        if self._side is None:  # (inline; still "pending", so a CPU run takes the same path)
            predict_and_fetch()
            self._pending[nxt] = None
            return
        # everything the prediction and the staging do runs on the side stream, beside the
        # main stream's MLP and the next layer's projections, selection and slot allocation
        main = torch.cuda.current_stream(self.device)
        side = self._side_high if sp.prefetch_high_priority else self._side
        side.wait_stream(main)
        with torch.cuda.stream(side):
            predict_and_fetch()
        for t in (residual, tables, lens, ctx.cos, ctx.sin, scores):
            if t is not None:
                t.record_stream(side)
        done = torch.cuda.Event()
        done.record(side)
        self._pending[nxt] = done

    def _join(self, layer: int) -> None:
        """The main stream waits for the prefetch of `layer` (before it reads the stage)."""
        done = self._pending.pop(layer, None)
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)

    def prefetch(self, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
                 kv_lens: torch.Tensor, scores: torch.Tensor | None = None,
                 rows: int = 1, resident: torch.Tensor | None = None) -> None:  # fmt: skip
        """Select `layer`'s pages for the predicted queries q [B, T, Hq, D] and copy the
        missing ones from the host to the stage, on the device (the exact step at that layer
        fills its slots from there and fetches only what the prediction missed). It never
        touches the slots or the page table, so the main stream runs beside it up to its
        own fetch; the pages that this step's `rows` rows per sequence go to are left out
        (their host copy is being written). `resident`: the layer's slot table as it was
        before the prefetch forked (None: the live one)."""
        B, Hkv = q.shape[0], self.Hkv
        for stale in self._staged.values():  # a step that never reached its fetch
            self.stage_of.index_fill_(0, stale, NOT_STAGED)
        self._staged.clear()
        scale = q.shape[-1] ** -0.5
        pages, counts = self._select(layer, q, block_tables, kv_lens, scale, scores)
        width = pages.shape[-1]
        if B * Hkv * width > self.num_slots:
            return  # the exact step will say so
        if self.stage is None:
            self.stage = torch.empty(self.num_slots + 1, 2, self.P, self.D,
                                     dtype=self.slots.dtype, device=self.device)  # fmt: skip
        # one kernel: each missing unit copied once to the stage, at its listing's row
        at, _ = stage_pages(
            self.host_units[layer], self.stage, self.stage_of, pages, counts, block_tables,
            kv_lens, self.slot_of[layer] if resident is None else resident, rows,
            self.scratch_unit, self._acc,
            (_C["fetched"], _C["prefetched"], _C["prefetch_waste"]),  # (waste until used)
            max_programs=self.sparse.prefetch_programs,
        )  # fmt: skip
        self._predicted[layer] = (pages, counts)
        self._staged[layer] = at

    def _ensure_resident(self, layer: int, units: torch.Tensor,
                         valid: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Slots [N] int32 of `units` [N] (entries where `valid` is false read the scratch
        slot); every valid unit is resident afterwards. Missing units take the least valuable
        slots that this step does not read (free ones first, then the oldest last use, then
        the fewest uses) and are fetched from the prefetch's stage or, failing that, from
        the host with the UVA gather; the wait for a pending prefetch comes just before that
        gather. All on the device: fixed shapes, no host round trip (kernels.tier_alloc)."""
        st = LayerState(self.slot_of[layer], self.unit_in[layer], self.last_used[layer],
                        self.uses[layer], self.host_units[layer],
                        self.slots[layer])  # fmt: skip
        staged = self._staged.pop(layer, None)
        slot = allocate(st, units, valid, self._claim, self.clock, self._acc, _C,
                        stage=None if staged is None else (self.stage, self.stage_of),
                        before_gather=lambda: self._join(layer))  # fmt: skip
        if staged is not None:  # the stage table is clean for the next layer's prefetch
            self.stage_of.index_fill_(0, staged, NOT_STAGED)
        return slot

    def _synthetic_scores(self, layer: int, block_tables: torch.Tensor) -> torch.Tensor:
        """Benchmarks with meaningless (dummy) weights: random scores, except that each page
        that the sequence (its batch row) read at this layer at the step before wins again
        with probability `sparse.synthetic` (0: a fresh random selection every step, the
        worst case for the GPU tier). Per row, not per physical page: sequences that share a
        prompt's pages do not keep each other's (a rule per page let eight sequences over
        one context settle on the pages any of them had read, and fetch nothing)."""
        B, M = block_tables.shape
        Hkv, sp, dev = self.Hkv, self.sparse, self.device
        read_last = self._synthetic_prev(layer, B)[..., :M]
        keep = read_last & (torch.rand(B, Hkv, M, device=dev) < sp.synthetic)
        scores = torch.rand(B, Hkv, M, device=dev) + 2.0 * keep.float()
        if sp.synthetic_recurring:
            # the pages to replace (read at the step before, not kept): about
            # `synthetic_recurring` of them come from pages read earlier, which rank
            # between the kept pages and the rest
            seen = self._synthetic_prev(layer, B, seen=True)[..., :M] & ~read_last
            need = (read_last & ~keep).sum(-1, keepdim=True).float()
            p = (sp.synthetic_recurring * need / seen.sum(-1, keepdim=True).clamp(min=1)).clamp(
                max=1
            )
            scores = scores + (seen & (torch.rand(B, Hkv, M, device=dev) < p)).float()
        return scores

    def _synthetic_prev(self, layer: int, rows: int, seen: bool = False) -> torch.Tensor:
        """[rows, Hkv, pages + 1] bool: the page positions each row read at `layer` at its
        last step (`seen`: at any step) (one buffer per layer and row count, updated in
        place: CUDA graphs)."""
        key = (layer, rows, seen)
        if key not in self._synth_prev:
            self._synth_prev[key] = torch.zeros(rows, self.Hkv, self.num_pages + 1,
                                                dtype=torch.bool, device=self.device)  # fmt: skip
        return self._synth_prev[key]

    def _oracle_scores(self, layer, q, block_tables, kv_lens, scale) -> torch.Tensor:
        """Exact attention mass per page (GQA group summed, max over the T queries)."""
        B, T, Hq, D = q.shape
        P, Hkv, G = self.P, self.Hkv, Hq // self.Hkv
        M = block_tables.shape[1]
        out = torch.full((B, Hkv, M), float("-inf"), device=q.device)
        host = self.host[layer]  # [pages, Hkv, 2, P, D]
        for b in range(B):
            n = int(kv_lens[b])
            n_pages = -(-n // P)
            pg = block_tables[b, :n_pages].long().to(host.device)
            k = host[pg][:, :, 0].permute(1, 0, 2, 3).reshape(Hkv, n_pages * P, D)[:, :n]
            k = k.float().to(q.device)
            qh = q[b].float().view(T, Hkv, G, D)
            logits = torch.einsum("thgd,hkd->thgk", qh, k) * scale
            q_pos = torch.arange(n - T, n, device=q.device)
            causal = torch.arange(n, device=q.device)[None, :] <= q_pos[:, None]
            logits = logits.masked_fill(~causal[:, None, None, :], float("-inf"))
            mass = torch.softmax(logits, -1).sum(2)  # [T, Hkv, n]
            mass = torch.nn.functional.pad(mass, (0, n_pages * P - n)).view(T, Hkv, n_pages, P)
            out[b, :, :n_pages] = mass.sum(-1).amax(0)
        return out

    def verify_width_for(self, batch: int, T: int, budget: int, max_pages: int) -> int | None:
        """The fixed union width of a verification graph: room for each later query to add
        a quarter of the budget in new pages (the real model's step-to-step locality is
        81-87%, docs/quality.md). None where the GPU tier cannot hold that for the batch
        (most unions would overflow: such steps verify eagerly)."""
        want = min(max_pages, budget + (T - 1) * -(-budget // 4))
        return want if batch * self.Hkv * want <= self.num_slots else None

    def budget_for(self, max_len: int, max_pages: int) -> int:
        """Pages per (sequence, KV head) that a step whose longest sequence has `max_len`
        tokens selects (the selection's width, fixed per CUDA graph)."""
        return min(self.sparse.budget_pages(-(-max_len // self.P), self.P), max_pages)

    def end_step(self, max_len: int | None = None, budget: int | None = None) -> None:
        """A new step begins; `max_len`: its longest sequence (saves a device read), or
        `budget`: the page budget itself (a CUDA graph's)."""
        self._group_selection = None
        self._per_query = None  # a verification's lengths and budgets: computed afresh
        if budget is None and max_len is not None:
            budget = self.sparse.budget_pages(-(-max_len // self.P), self.P)
        self.step_budget = budget
