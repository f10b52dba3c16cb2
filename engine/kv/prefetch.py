"""The Forecast prefetch (engine.kv.forecast): after layer l's attention, predict layer
l+1's selection from the residual stream and copy its missing pages from the host into a
stage on the device, on a side stream on a GPU. Layer l+1 selects exactly and allocates
its slots meanwhile, waits for the prefetch only at its fetch, and then fills its missing
slots from the stage where the prediction got them, from the host otherwise. The prefetch
never touches the slots or the page table, so nothing else waits for it. When it runs is
the policy's (engine.kv.prefetch_policy)."""

from __future__ import annotations

import torch

from engine.kv.residency import Residency
from engine.kv.selection import Selection
from engine.kv.sparse_config import C, SparseConfig
from kernels.page_recall import RecallCounters, count_recall
from kernels.uva_gather import NOT_STAGED, stage_pages
from kernels.views import Counters, GatherLaunch, PageTable, Resident, Selected, Stage


class Prefetcher:
    """The stage, the side streams, and each layer's predicted pages (for recall@k)."""

    def __init__(self, sparse: SparseConfig, residency: Residency, selection: Selection,
                 acc: torch.Tensor, Hkv: int) -> None:  # fmt: skip
        self.sparse, self.res, self.sel, self.acc, self.Hkv = sparse, residency, selection, acc, Hkv
        device = residency.device
        units = residency.scratch_unit
        self.device = device
        self.predicted: dict[int, tuple[torch.Tensor, ...]] = {}  # each layer's predicted pages
        self._recall_mark: torch.Tensor | None = None  # count_recall's scratch (zeros)
        self._recall_marks_old: list = []  # earlier, smaller ones (captured graphs use them)
        self.recall_by_layer = torch.zeros(residency.L, 2, dtype=torch.long, device=device)
        self.pending: dict[int, torch.cuda.Event | None] = {}
        # the stage: rows of units copied ahead to the device, and per unit its row
        # (NOT_STAGED: none; one table for every layer, reset once a layer's step has used
        # it); `staged[layer]`: the units a pending prefetch listed
        self.stage: torch.Tensor | None = None
        self.stage_of = torch.full((units + 1,), NOT_STAGED, dtype=torch.int32, device=device)
        self.staged: dict[int, torch.Tensor] = {}
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

    def forget(self) -> None:
        """Drop what pending prefetches staged and predicted (the counters were reset)."""
        self.recall_by_layer.zero_()
        self._unstage()
        self.predicted.clear()

    def _unstage(self) -> None:
        for stale in self.staged.values():
            self.stage_of.index_fill_(0, stale, NOT_STAGED)
        self.staged.clear()

    def launch(self, layer: int, residual: torch.Tensor, ctx, forecast) -> None:
        """Layer `layer - 1`'s attention is done (residual: the stream before its MLP):
        predict layer `layer`'s selection and fetch its missing pages, on a side stream on a
        GPU."""
        tables, lens = ctx.tier_tables, ctx.tier_lens
        B = tables.shape[0]
        scorer = self.sel.scorer
        # (a scorer's draws stay on the main stream)
        scores = None if scorer is None else scorer.predicted_scores(layer, tables)
        resident = None
        if self._resident is not None:
            resident = self._resident[layer % 2]
            resident.copy_(self.res.slot_of[layer])

        def predict_and_fetch() -> None:
            if scores is not None:
                q = residual.new_zeros(B, 1, 1, self.res.host_units[0].shape[-1])
            else:
                q = forecast.query(layer, residual, ctx)
                q = q.view(B, q.shape[0] // B, *q.shape[1:])
            self.prefetch(layer, q, tables, lens, scores, rows=residual.shape[0] // B,
                          resident=resident)  # fmt: skip

        if self._side is None:  # (inline; still "pending", so a CPU run takes the same path)
            predict_and_fetch()
            self.pending[layer] = None
            return
        # everything the prediction and the staging do runs on the side stream, beside the
        # main stream's MLP and the next layer's projections, selection and slot allocation
        main = torch.cuda.current_stream(self.device)
        side = self._side_high if self.sparse.prefetch_high_priority else self._side
        side.wait_stream(main)
        with torch.cuda.stream(side):
            predict_and_fetch()
        for t in (residual, tables, lens, ctx.cos, ctx.sin, scores):
            if t is not None:
                t.record_stream(side)
        done = torch.cuda.Event()
        done.record(side)
        self.pending[layer] = done

    def join(self, layer: int) -> None:
        """The main stream waits for the prefetch of `layer` (before it reads the stage)."""
        done = self.pending.pop(layer, None)
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
        B, res = q.shape[0], self.res
        self._unstage()  # a step that never reached its fetch
        scale = q.shape[-1] ** -0.5
        pages, counts = self.sel.select(layer, q, block_tables, kv_lens, scale, scores)
        width = pages.shape[-1]
        if B * self.Hkv * width > res.num_slots:
            return  # the exact step will say so
        if self.stage is None:
            self.stage = torch.empty(res.num_slots + 1, *res.slots.shape[2:],
                                     dtype=res.slots.dtype, device=self.device)  # fmt: skip
        # one kernel: each missing unit copied once to the stage, at its listing's row
        programs = self.sparse.prefetch_programs
        programs = res.allocator.gather_programs if programs is None else programs
        at, _ = stage_pages(
            res.host_units[layer], Stage(self.stage, self.stage_of), Selected(pages, counts),
            PageTable(block_tables, kv_lens, self.sel.P),
            Resident(res.slot_of[layer] if resident is None else resident, res.scratch_unit),
            rows, Counters(self.acc, (C["fetched"], C["prefetched"], C["prefetch_waste"])),
            GatherLaunch(programs),  # (the waste counts until the stage is used)
        )  # fmt: skip
        self.predicted[layer] = (pages, counts)
        self.staged[layer] = at

    def ensure_resident(self, layer: int, units: torch.Tensor,
                        valid: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Residency.ensure_resident, filling from this layer's stage where a prefetch
        staged units, and waiting for the prefetch just before the gather."""
        staged = self.staged.pop(layer, None)
        slot = self.res.ensure_resident(layer, units, valid,
                                        None if staged is None else Stage(self.stage, self.stage_of),
                                        lambda: self.join(layer))  # fmt: skip
        if staged is not None:  # the stage table is clean for the next layer's prefetch
            self.stage_of.index_fill_(0, staged, NOT_STAGED)
        return slot

    def count_recall(self, layer: int, pages: torch.Tensor, valid: torch.Tensor,
                     predicted: tuple, M: int) -> None:  # fmt: skip
        """recall@k of the prediction against the exact selection (after the prefetch's wait)."""
        n = pages.shape[0] * self.Hkv * M
        if self._recall_mark is None or self._recall_mark.numel() < n:
            # (a graph captured with the old scratch still writes it: keep it alive)
            self._recall_marks_old.append(self._recall_mark)
            self._recall_mark = torch.zeros(n, dtype=torch.int8, device=pages.device)
        counters = RecallCounters(self.acc, C["recall_hits"], C["recall_total"],
                                  self.recall_by_layer, self._recall_mark)  # fmt: skip
        count_recall(pages, valid, *predicted, M, counters, layer)
