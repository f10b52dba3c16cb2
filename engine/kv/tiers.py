"""The tiered KV cache: a full host copy, a GPU working set of page slots, sparse decode.

Tiers:
- host tier: the paged pool [layers, pages, kv_heads, 2, P, D] that every K/V row is
  written to (write-through: nothing is lost when a slot is dropped). On a GPU machine it is
  meant to live in pinned host memory; on the CPU it is ordinary memory.
- GPU tier (engine.kv.residency): per layer, a pool of `num_slots` page units [2, P, D]
  under a byte budget and the page table between units and slots. It holds the protected
  working set (this step's selected pages, which include the sinks and the local window)
  and, while room lasts, any other pages it held before (optional residency); those are
  shed first, least valuable first, whenever the working set needs room.
- page summaries (engine.kv.selection): per layer, beside the GPU tier, updated on every
  append: Quest's min and max of the page's keys in the keys' dtype, or the sum of its keys
  in fp32 for mean-key scoring (kernels.page_score.summary_rows).

Decode attention of a layer (every sequence of the step with one new token, or T tokens of
a verification): select its pages (engine.kv.selection), fetch the selected pages that have
no slot from the host, then run the sparse decode kernel over the slots. The result is
exactly sparse attention over the selected pages.

Verification (speculative decoding, engine.spec): the T = k+1 queries of a sequence each
select their own pages, the union is fetched once, and the kernel masks each query to its
own pages, so the result is what T single-token steps would compute, at the cost of one
fetch. The rows of a verification fold into the summaries only once accepted
(`fold_rows`); pages of rejected positions leave the page table and the GPU tier
(`drop_pages`).

Forecast prefetch (engine.kv.prefetch): after layer l's attention, `after_attention`
stages layer l+1's predicted pages on the device while layer l+1 computes. Counters:
recall of the prediction, prefetch hits, waste, and the fetches left on the critical path.

Everything in a decode step runs on the device with fixed shapes (slot allocation and
eviction included), so the step can be captured in a CUDA graph.

Prefill stays dense and exact (engine.layers.attention); its rows go to the host tier and the
summaries like any other.
"""

from __future__ import annotations

import torch

from engine.kv.prefetch import Prefetcher
from engine.kv.prefetch_policy import PrefetchPolicy
from engine.kv.residency import Residency, SlotAllocator
from engine.kv.selection import Selection
from engine.kv.sparse_config import COUNTERS, C, SparseConfig, TierStats
from kernels.kv_append import fold_summaries, tier_append
from kernels.sparse_decode import sparse_decode_attention
from kernels.step_units import SelectedCounters, step_units
from kernels.views import PageList, RowPlaces, SlotTable


class TieredKV:
    """The facade the model and the runner use: append, attend, fold, drop, the prefetch
    after a layer, and the counters."""

    def __init__(self, host_pool: torch.Tensor, page_size: int, sparse: SparseConfig,
                 device: torch.device, forecast=None,
                 allocator: SlotAllocator | None = None) -> None:  # fmt: skip
        """Quest summaries are in the pool's dtype, fp8 for an fp8 pool: exact, as they are
        folded from the keys as the pool holds them."""
        self.sparse, self.device, self.host, self.forecast = sparse, device, host_pool, forecast
        self.L, self.num_pages, self.Hkv, _, self.P, self.D = host_pool.shape
        self.unit_bytes = 2 * self.P * self.D * host_pool.element_size()
        units = self.num_pages * self.Hkv
        if sparse.gpu_kv_budget is None:
            self.num_slots = units
        else:
            self.num_slots = max(1, sparse.gpu_kv_budget // (self.L * self.unit_bytes))
        # device-side counters, read when `stats` is asked for (engine.kv.sparse_config)
        self._acc = torch.zeros(len(COUNTERS), dtype=torch.long, device=device)
        self.residency = Residency(host_pool, self.num_slots, device, self._acc, allocator,
                                   sparse.eviction)  # fmt: skip
        self.selection = Selection(sparse, host_pool, device)
        self.prefetcher = Prefetcher(sparse, self.residency, self.selection, self._acc, self.Hkv)
        self.policy = PrefetchPolicy(sparse, self._acc, self.unit_bytes, device)
        res = self.residency
        self.scratch_slot, self.scratch_unit, self.clock = (
            res.scratch_slot,
            res.scratch_unit,
            res.clock,
        )
        self.verify_overflow = self.selection.verify_overflow
        # the top-k method per selection shape (its public chosen_methods(): benchmarks)
        self.select_methods = self.selection.methods
        self.trials = self.policy.trials  # (engine.prefetch_state)
        # a verification's rows fold into the summaries only once accepted (fold_rows)
        self.defer_summaries = False
        # a verification in a CUDA graph lists each union in a fixed width; a union that
        # does not fit sets `verify_overflow` (the caller then verifies again eagerly)
        self.verify_width: int | None = None

    # -- counters and sizes for the meter ---------------------------------------------------

    def resident_units(self) -> int:
        return self.residency.resident_units()

    @property
    def stats(self) -> TierStats:
        """The counters (reading them waits for the device)."""
        c = dict(zip(COUNTERS, self._acc.tolist(), strict=True))
        return TierStats(**c, fetched_bytes=c["fetched"] * self.unit_bytes)

    def reset_stats(self) -> None:
        self._acc.zero_()
        self.policy.counters_reset()
        self.prefetcher.forget()
        if self.selection.scorer is not None:
            self.selection.scorer.reset()

    def reconfigure(self, sparse: SparseConfig) -> None:
        """Select by `sparse` from the next step on (an evaluation comparing settings over
        one cache; the GPU tier and the summaries' kind stay), its seed afresh."""
        self.sparse = sparse
        for part in (self.selection, self.prefetcher, self.policy):
            part.sparse = sparse
        self.residency.set_eviction(sparse.eviction)
        self.selection.reseed()

    def prefetching(self) -> bool:
        """Whether decode steps prefetch now (a forecast, and the policy says so)."""
        return self.policy.prefetching()

    @property
    def need_mib(self) -> float | None:
        return self.policy.need_mib

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
        fold, sel = not self.defer_summaries, self.selection
        res = self.residency
        tier_append(k, v, SlotTable(res.slots[layer], res.slot_of[layer]), sel.summ[layer],
                    RowPlaces(pages.to(self.device), offsets.to(self.device)), sel.rows, fold,
                    use_triton=None if (distinct or not fold) else False)  # fmt: skip

    def fold_rows(self, pages: list[int], offsets: list[int]) -> None:
        """Fold rows already in the host tier (a verification's accepted positions, in
        order) into every layer's summaries, all layers in one pass."""
        if not pages:
            return
        L, Hkv, D, dev = self.L, self.Hkv, self.D, self.device
        pg, off = torch.tensor(pages), torch.tensor(offsets)
        k = self.host[:, pg, :, 0, off].transpose(0, 1)  # [L, T, Hkv, D]
        all_summ = self.selection.summ
        per_layer = all_summ.shape[1]  # units + the scratch unit
        base = torch.arange(L, device=dev)[:, None] * per_layer
        units = (pg.to(dev)[:, None] * Hkv + torch.arange(Hkv, device=dev)).reshape(1, -1)
        fresh = (off.to(dev) == 0)[:, None].expand(-1, Hkv).reshape(1, -1).expand(L, -1)
        summ = all_summ.view(L * per_layer, *all_summ.shape[2:])
        fold_summaries(summ, k.reshape(-1, D), (base + units).reshape(-1), fresh.reshape(-1),
                       (base + self.scratch_unit).expand(L, units.shape[1]).reshape(-1),
                       self.selection.rows)  # fmt: skip

    def drop_pages(self, pages: list[int]) -> None:
        """Pages that left their sequence (rolled back): free their slots in every layer."""
        self.residency.drop_pages(pages, self.Hkv)

    # -- sparse decode ----------------------------------------------------------------------

    def attend(self, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
               kv_lens: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
        """q [B, T, Hq, D] (the last T positions of each sequence) -> [B, T, Hq, D]. Runs
        on the device only (no host round trip), so a decode step can be a CUDA graph."""
        B, T, Hq, D = q.shape
        sp, Hkv, pf = self.sparse, self.Hkv, self.prefetcher
        if layer == 0:
            self.clock += 1
        predicted = pf.predicted.pop(layer, None)
        if sp.forecast_only:  # the prediction is the selection: wait for it now
            pf.join(layer)
        forced = predicted if sp.forecast_only else None
        pages, counts, qmask = self.selection.for_layer(layer, q, block_tables, kv_lens, scale,
                                                        self.verify_width, forced)  # fmt: skip
        width = pages.shape[-1]
        if B * Hkv * width > self.num_slots:
            from engine.errors import CacheFullError

            raise CacheFullError(
                f"the GPU KV budget holds {self.num_slots} pages per layer, fewer than this "
                f"step's {B * Hkv * width} selected pages: raise --gpu-kv-budget or lower the "
                "sparse budget"
            )
        # the units the step reads (one kernel, the step's counts with them), and their
        # slots (fetching what is missing)
        counted = SelectedCounters(self._acc, C["selected"], C["max_selected"], C["steps"])
        units, valid = step_units(block_tables, pages, counts, Hkv, counted)
        if qmask is not None and not sp.verify_shared_fetch:  # the per-query way (benchmarks)
            for t in range(T):
                mine = valid & (((qmask.reshape(-1) >> t) & 1) != 0)
                pf.ensure_resident(layer, units, mine)
        slots = pf.ensure_resident(layer, units, valid)
        if predicted is not None and not sp.forecast_only:  # recall@k (after the prefetch's wait)
            pf.count_recall(layer, pages, valid.view(B, Hkv, width), predicted,
                            block_tables.shape[1])  # fmt: skip
        listed = PageList(slots.view(B, Hkv, width), pages.to(torch.int32), counts, qmask)
        return sparse_decode_attention(q.contiguous(), self.residency.slots[layer], listed,
                                       kv_lens.to(torch.int32), scale)  # fmt: skip

    def after_attention(self, layer: int, residual: torch.Tensor, ctx) -> None:
        """Layer `layer`'s attention is done (residual: the stream before its MLP): predict
        the next layer's selection and fetch its missing pages, on a side stream on a GPU."""
        nxt = layer + 1
        if not self.prefetching() or nxt >= self.L or nxt % self.sparse.layer_group:
            return
        self.prefetcher.launch(nxt, residual, ctx, self.forecast)

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
        return self.selection.budget_for(max_len, max_pages)

    def end_step(self, max_len: int | None = None, budget: int | None = None) -> None:
        """A new step begins; `max_len`: its longest sequence (saves a device read), or
        `budget`: the page budget itself (a CUDA graph's)."""
        if budget is None and max_len is not None:
            budget = self.sparse.budget_pages(-(-max_len // self.P), self.P)
        self.selection.begin_step(budget)
