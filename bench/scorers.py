"""Page scorers for benchmarks and evaluations (engine.kv.selection.PageScorer), and the
prefill-skipping attention of dummy-weight benchmarks. The engine's own selection reads the
page summaries; these take its place:

- `SyntheticScorer`: dummy weights carry no attention to select by, so benchmarks draw
  selections with the locality measured on the real model (each page read at the step
  before kept with probability `keep`; of the new pages, `recurring` drawn from pages read
  earlier), and simulate a Forecast predictor of a given `recall`;
- `OracleScorer`: the exact attention mass per page (evaluation: reads every page).

`skip_prefill_attention` and `keep_all_summaries` change an engine for a benchmark or an
evaluation in the same way.

`use_scorer(engine, scorer)` puts one in (None: the summaries again).
"""

from __future__ import annotations

import torch

from bench.synthetic_draw import NEVER, synthetic_draw, synthetic_stamp
from bench.synthetic_select import synthetic_query_scores
from engine.kv import PageScorer


def use_scorer(engine, scorer: PageScorer | None) -> None:
    """Select by `scorer` from the next step on. The decode graphs are captured again (the
    selection path is part of them); a scorer that reads the host turns them off."""
    runner = engine.runner
    runner.tiers.selection.scorer = scorer
    runner.reset_graphs()
    if scorer is not None and not scorer.graphable:
        for graphs in (runner.decode_graphs, runner.verify_graphs):
            if graphs is not None:
                graphs.enabled = False


# What the synthetic selections copy, measured on a real model: Qwen2.5-Coder-0.5B-Instruct
# on the H200, 130,992 tokens of Moby-Dick with YaRN x4, 2% of the pages per (layer, KV
# head) and step (docs/gpu_real_model_128k.json, docs/sparse_quality_qwen05_128k.json):
MEASURED_LOCALITY = 0.77  # of a layer's pages, the share it also read at the step before
MEASURED_RECURRING = 0.86  # of the others, the share it read at an earlier step
MEASURED_FORECAST_RECALL = 0.89  # the trained Forecast's recall@k at layer l+1


class SyntheticScorer(PageScorer):
    """Random selections with a set locality (benchmarks with dummy weights only).

    `keep`: the probability that a page the sequence (its batch row) read at this layer at
    the step before wins again (0: fresh random pages every step, the worst case for the
    GPU tier); `recurring`: of the pages a step does not keep, this share is drawn from
    pages the row read at earlier steps (which a GPU tier that keeps used pages still
    holds; the default model's selections measured 0.86-0.89, bench.page_recurrence); with
    a forecast, `recall`: each page of the next layer's selection is predicted with this
    probability (1.0: the oracle prefetch; the training-free predictor measured 0.92-0.93,
    docs/quality.md). Per row, not per physical page: sequences that share a prompt's pages
    do not keep each other's (a rule per page let eight sequences over one context settle
    on the pages any of them had read, and fetch nothing). A decode step also computes the
    engine's own page scores and drops them, so that it costs what a real step does."""

    def __init__(self, tiers, keep: float, recurring: float = 0.0, recall: float = 1.0):
        self.tiers, self.keep, self.recurring, self.recall = tiers, keep, recurring, recall
        self._next: dict[int, torch.Tensor] = {}  # drawn ahead by a simulated forecast
        self._prev: dict[tuple[int, int, str], torch.Tensor] = {}

    def reset(self) -> None:
        self._next.clear()

    def decode_scores(self, layer, q, block_tables, kv_lens, scale) -> torch.Tensor:
        self.real_scores(layer, q, block_tables, kv_lens)
        scores = self._next.pop(layer, None)  # drawn ahead by a synthetic forecast, or now
        return self.draw(layer, block_tables) if scores is None else scores

    def real_scores(self, layer, q, block_tables, kv_lens) -> torch.Tensor:
        """The scores the engine's own selection computes (page_scores over the summaries),
        not used: a step with synthetic selections costs what a real one does."""
        from kernels.page_score import PageSummaries, page_scores
        from kernels.views import PageTable

        t = self.tiers
        summ = PageSummaries(t.selection.summ[layer], t.Hkv, t.sparse.summary)
        return page_scores(q, summ, PageTable(block_tables, kv_lens.to(torch.int32), t.P))

    def verify_scores(self, layer, block_tables, budgets, T) -> torch.Tensor:
        """Query 0 draws as a decode step would (the draw a prefetch predicted from, if one
        ran); each later query keeps 85% of its pages (the step-to-step locality measured
        on the real model), and about `recurring` of the pages that replace the dropped ones
        were read at earlier steps: on the real model a k = 4 verification fetched 3.8-4.4x
        a one-token step, about what its 5 queries would as 5 steps (bench.verify_union,
        docs/verify_union*.json); with those pages drawn at random, the H200 bench's
        fetched 11x."""
        first = self._next.pop(layer, None)
        if first is None:
            first = self.draw(layer, block_tables)
        seen = None
        if self.recurring:
            seen = self.seen_pages(layer, block_tables.shape[0])
        return synthetic_query_scores(first, T, budgets, seen, self.recurring,
                                      self.tiers.clock, layer)  # fmt: skip

    def predicted_scores(self, layer, block_tables) -> torch.Tensor:
        """The next layer's synthetic selection, drawn now; the prediction is that selection
        with each page kept with probability `recall` (the rest of the budget goes to other
        pages). (Random draws stay on the main stream.)"""
        exact = self.draw(layer, block_tables)
        self._next[layer] = exact
        miss = torch.rand(exact.shape, device=self.tiers.device) >= self.recall
        return exact - 4.0 * miss.float()

    def draw(self, layer: int, block_tables: torch.Tensor) -> torch.Tensor:
        """Random scores [B, Hkv, M], except that each page the row read at this layer at
        the step before wins again with probability `keep` (bench.synthetic_draw: one
        kernel on a GPU)."""
        B, M = block_tables.shape
        Hkv, dev, clock = self.tiers.Hkv, self.tiers.device, self.tiers.clock
        stamp = self.stamps(layer, B)
        scores = synthetic_draw(stamp, clock, self.keep, M, salt=layer)
        if self.recurring:
            read_last = stamp[..., :M] == (clock - 1).to(torch.int32)
            keep = scores >= 2.0  # (the kept pages: the rest score below 1)
            # the pages to replace (read at the step before, not kept): about `recurring`
            # of them come from pages read earlier, which rank between the kept pages and
            # the rest
            seen = self.seen_pages(layer, B)[..., :M] & ~read_last
            need = (read_last & ~keep).sum(-1, keepdim=True).float()
            p = (self.recurring * need / seen.sum(-1, keepdim=True).clamp(min=1)).clamp(max=1)
            scores = scores + (seen & (torch.rand(B, Hkv, M, device=dev) < p)).float()
        return scores

    def selected(self, layer, pages, valid) -> None:
        """What each row read at this step (pages, valid [B, T, Hkv, W]: T queries), for
        the next step's locality: the last query's pages, stamped with the step; and every
        query's among the pages read at any step (the recurring draws')."""
        B = pages.shape[0]
        synthetic_stamp(self.stamps(layer, B), pages[:, -1], valid[:, -1], self.tiers.clock)
        if self.recurring:
            none = self.tiers.num_pages
            seen = self.seen_pages(layer, B)
            at = torch.where(valid, pages.long(), none).transpose(1, 2)
            seen.scatter_(-1, at.reshape(B, self.tiers.Hkv, -1), True)
            seen[..., none] = False

    def stamps(self, layer: int, rows: int) -> torch.Tensor:
        """[rows, Hkv, pages + 1] int32: the step at which each row last read each page at
        `layer` (one buffer per layer and row count, updated in place: CUDA graphs)."""
        key = (layer, rows, "stamp")
        if key not in self._prev:
            t = self.tiers
            self._prev[key] = torch.full((rows, t.Hkv, t.num_pages + 1), NEVER,
                                         dtype=torch.int32, device=t.device)  # fmt: skip
        return self._prev[key]

    def seen_pages(self, layer: int, rows: int) -> torch.Tensor:
        """[rows, Hkv, pages + 1] bool: the pages each row read at `layer` at any step (one
        buffer per layer and row count, updated in place: CUDA graphs)."""
        key = (layer, rows, "seen")
        if key not in self._prev:
            t = self.tiers
            self._prev[key] = torch.zeros(rows, t.Hkv, t.num_pages + 1, dtype=torch.bool,
                                          device=t.device)  # fmt: skip
        return self._prev[key]


class OracleScorer(PageScorer):
    """Exact attention mass per page (GQA group summed, max over the T queries): what the
    summaries approximate (evaluation only: it reads every page, on the host)."""

    graphable = False  # (host reads of the lengths)
    per_query = False  # (one selection for a verification's queries, by their max)

    def __init__(self, tiers) -> None:
        self.tiers = tiers

    def decode_scores(self, layer, q, block_tables, kv_lens, scale) -> torch.Tensor:
        B, T, Hq, D = q.shape
        P, Hkv = self.tiers.P, self.tiers.Hkv
        G = Hq // Hkv
        M = block_tables.shape[1]
        out = torch.full((B, Hkv, M), float("-inf"), device=q.device)
        host = self.tiers.host[layer]  # [pages, Hkv, 2, P, D]
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


def keep_all_summaries(engine) -> None:
    """All three summary rows (min, max and sum), so that an evaluation can switch the
    summary kind between configs over one cache (before the first token is appended)."""
    from kernels.page_score import empty_summaries, summary_rows

    selection = engine.runner.tiers.selection
    L, units, _, D = selection.summ.shape
    summ = empty_summaries(L * units, D, selection.device, mode=None)
    selection.summ, selection.rows = summ.view(L, units, *summ.shape[1:]), summary_rows(None)


def skip_prefill_attention(engine) -> None:
    """Prefill steps write their KV (host tier, page summaries) but attend to nothing (the
    attention output is zeros), so a 500K-token context is built in seconds instead of
    minutes of causal attention; decode steps and verifications are unchanged (benchmarks
    with dummy weights only: their KV's values mean nothing either way)."""
    for layer in engine.runner.model.layers:
        attn = layer.self_attn
        attn.paged_attention = _zeros_on_prefill(attn.paged_attention)


def _zeros_on_prefill(dense):
    def attention(q, k, v, kv, ctx, scale, layer=0):
        lens = ctx.query_lens  # (None: a graph's step, decode or verification)
        n = lens[0] if lens else 1
        decode = lens is None or ((n == 1 or ctx.verify) and all(m == n for m in lens))
        return dense(q, k, v, kv, ctx, scale, layer) if decode else torch.zeros_like(q)

    return attention
