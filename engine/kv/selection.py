"""Page selection for sparse decode: score each (sequence, KV head)'s pages with the GQA
group pooled, select sinks + window + top-k (+ an optional stochastic tail), and, for a
verification, each query's own selection with their union listed once.

Scores come from the page summaries (Quest's min/max bound or the mean key,
kernels.page_score; the top-k by kernels.page_topk, its method per shape chosen by
engine.kv.select_methods), or from a `PageScorer` put in their place: benchmarks and evaluations
bring their own (bench.scorers: random selections on dummy weights, the oracle's exact
attention mass). One selection may serve a group of consecutive layers.
"""

from __future__ import annotations

import torch

from engine.kv.select_methods import SelectMethods
from engine.kv.sparse_config import SparseConfig
from kernels.page_score import PageSummaries, empty_summaries, page_scores, summary_rows
from kernels.page_topk import select_pages
from kernels.page_union import union_pages
from kernels.views import PageTable, SelectRule


class PageScorer:
    """Page scores in place of the summaries' (a benchmark's or an evaluation's).

    `graphable`: its steps can be captured in CUDA graphs (no host reads); `per_query`: a
    verification's queries select one by one (False: one selection for all of them, from
    the scores of all T queries)."""

    graphable = True
    per_query = True

    def decode_scores(self, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
                      kv_lens: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
        """Scores [B, Hkv, M] of every page for queries q [B, T, Hq, D]."""
        raise NotImplementedError

    def verify_scores(self, layer: int, block_tables: torch.Tensor, budgets: torch.Tensor,
                      T: int) -> torch.Tensor:  # fmt: skip
        """Scores [B * T, Hkv, M] of a verification's T queries (budgets [B * T])."""
        raise NotImplementedError

    def predicted_scores(self, layer: int, block_tables: torch.Tensor) -> torch.Tensor | None:
        """At the layer before: the scores a Forecast prefetch of `layer` selects by (None:
        the Forecast's query over the summaries)."""
        return None

    def selected(self, layer: int, pages: torch.Tensor, valid: torch.Tensor) -> None:
        """What a step selected with these scores (pages, valid [B, T, Hkv, W])."""

    def reset(self) -> None:
        """The counters were reset (a benchmark's run starts afresh)."""


class Selection:
    """The page summaries of every layer, and the step's selection from them."""

    def __init__(self, sparse: SparseConfig, host_pool: torch.Tensor, device: torch.device):
        L, num_pages, Hkv, _, P, D = host_pool.shape  # (the host tier's layout)
        units, dtype = num_pages * Hkv, host_pool.dtype  # (Quest summaries: the keys' dtype)
        self.sparse, self.P, self.Hkv, self.device = sparse, P, Hkv, device
        self.scorer: PageScorer | None = None
        self.methods = SelectMethods()  # the top-k method per shape, timed at its first call
        # one allocation for every layer (at 500K tokens of the 8B: 3.8 GiB of bf16 Quest
        # summaries, 1.9 GiB of fp8 ones)
        summ = empty_summaries(L * (units + 1), D, device, mode=sparse.summary, dtype=dtype)
        self.summ = summ.view(L, units + 1, *summ.shape[1:])
        self.rows = summary_rows(sparse.summary)
        self.step_budget: int | None = None
        self._group: tuple | None = None  # the selection a layer group shares
        # a verification's query lengths and budgets (layer 0 computes them for the step)
        self._per_query: tuple | None = None
        self._seq_budgets: tuple | None = None  # (lengths tensor, step budget, budgets)
        self._union_bits: torch.Tensor | None = None  # a verification union's bitmap (zeros)
        self._union_bits_old: list = []
        self._gen = torch.Generator(device=device).manual_seed(sparse.seed)
        # a verification in a CUDA graph lists each union in a fixed width; a union that
        # does not fit sets `verify_overflow` (the caller then verifies again eagerly)
        self.verify_overflow = torch.zeros((), dtype=torch.int32, device=device)

    def reseed(self) -> None:
        self._gen.manual_seed(self.sparse.seed)

    def begin_step(self, budget: int | None) -> None:
        self._group = None
        self._per_query = None  # a verification's lengths and budgets: computed afresh
        self.step_budget = budget

    def budget_for(self, max_len: int, max_pages: int) -> int:
        """Pages per (sequence, KV head) that a step whose longest sequence has `max_len`
        tokens selects (the selection's width, fixed per CUDA graph)."""
        return min(self.sparse.budget_pages(-(-max_len // self.P), self.P), max_pages)

    def for_layer(self, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
                  kv_lens: torch.Tensor, scale: float, width: int | None,
                  forced: tuple | None = None) -> tuple:  # fmt: skip
        """The selection layer `layer` reads (pages, counts, qmask or None): its group's,
        `forced` (a prediction read as it is), or its own."""
        sp, T = self.sparse, q.shape[1]
        if forced is not None:
            self._group = forced + (None,)
        elif layer % sp.layer_group == 0 or self._group is None:
            if T > 1 and (self.scorer is None or self.scorer.per_query):
                self._group = self.select_per_query(q, layer, block_tables, kv_lens, width)
            else:
                self._group = self.select(layer, q, block_tables, kv_lens, scale) + (None,)
        return self._group

    def select(self, layer, q, block_tables, kv_lens, scale,
               scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Scores of every page of each (sequence, KV head) for queries q (or the given
        scores), then the selection (pages [B, Hkv, budget], counts [B, Hkv])."""
        sp, P, Hkv = self.sparse, self.P, self.Hkv
        budget = self.step_budget
        if budget is None:  # a device read: callers say the step's length in end_step
            budget = self.budget_for(int(kv_lens.max()), block_tables.shape[1])
        budget = min(budget, block_tables.shape[1])
        record = scores is None and self.scorer is not None
        if record:
            scores = self.scorer.decode_scores(layer, q, block_tables, kv_lens, scale)
        elif scores is None:
            scores = page_scores(
                q,
                PageSummaries(self.summ[layer], Hkv, sp.summary),
                PageTable(block_tables, kv_lens, P),
            )
        # each sequence's own budget (the step's is the longest one's): its pages do not
        # depend on what else is in the batch; computed once per step (every layer and the
        # prefetch get the same lengths tensor), int32 as the select kernels take it (not a
        # cast kernel a layer)
        cached = self._seq_budgets
        if cached is not None and cached[0] is kv_lens and cached[1] == budget:
            budgets = cached[2]
        else:
            budgets = self.budget_pages((kv_lens.long() + P - 1) // P).clamp(max=budget)
            budgets = budgets.to(torch.int32)
            self._seq_budgets = (kv_lens, budget, budgets)
        rule = SelectRule(P, budget, sp.sink_pages, sp.window_pages,
                          width=None if sp.tail_pages else budget)  # fmt: skip
        pages, counts = select_pages(
            scores, kv_lens, rule, budgets, self.methods.method_for(scores, kv_lens, rule, budgets),
            sp.tail_pages, generator=self._gen if sp.tail_pages else None,
        )  # fmt: skip
        if record:
            valid = torch.arange(pages.shape[-1], device=pages.device) < counts[..., None]
            self.scorer.selected(layer, pages[:, None], valid[:, None])
        return pages, counts

    def select_per_query(self, q, layer, block_tables, kv_lens, width: int | None = None):
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
            budgets = self.budget_pages((lens + P - 1) // P).clamp(max=M)
            self._per_query = (lens.to(torch.int32), budgets.to(torch.int32))
        lens, budgets = self._per_query
        if self.scorer is not None:
            scores = self.scorer.verify_scores(layer, block_tables, budgets, T)
        else:
            scores = page_scores(q, PageSummaries(self.summ[layer], Hkv, sp.summary),
                                 PageTable(block_tables, kv_lens.to(torch.int32), P),
                                 per_query=True).reshape(B * T, Hkv, M)  # fmt: skip
        top = min(int(budgets.max()), M) if self.step_budget is None else min(self.step_budget, M)
        rule = SelectRule(P, top, sp.sink_pages, sp.window_pages, width=top)
        pages, counts = select_pages(scores, lens, rule, budgets,
                                     self.methods.method_for(scores, lens, rule, budgets))  # fmt: skip
        if self.scorer is not None:  # (the next step follows the last query: all accepted)
            valid = torch.arange(top, device=dev)[None, None, :] < counts[..., None]
            self.scorer.selected(layer, pages.view(B, T, Hkv, top), valid.view(B, T, Hkv, top))
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

    def budget_pages(self, n_pages: torch.Tensor) -> torch.Tensor:
        """SparseConfig.budget_pages for a tensor of page counts."""
        sp = self.sparse
        want = torch.zeros_like(n_pages)
        if sp.budget_tokens is not None:
            want = want + -(-sp.budget_tokens // self.P)
        if sp.budget_fraction is not None:
            frac = torch.ceil(sp.budget_fraction * n_pages.double()).long()
            want = torch.maximum(want, frac)
        return want.clamp(min=sp.sink_pages + sp.window_pages + 1)
