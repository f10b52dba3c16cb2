"""Sparse decode's settings (SparseConfig) and the tiered cache's counters (TierStats)."""

from __future__ import annotations

import math
from dataclasses import dataclass


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
    layer_group: int = 1  # consecutive layers that share one selection
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
    gpu_kv_budget: int | None = None  # bytes for the GPU slot pools; None: room for all pages
    # which slots a missing page takes (engine.kv.residency): "clock" (a hand over the ring of
    # slots, second chance for a slot read since it passed; 4 kernels a layer: 1.05-1.14x the
    # value eviction's decode speed at 128K on the H200, docs/benchmarks.md) or "value" (the
    # least valuable: free, then the oldest last read, then the fewest reads; a select over
    # every slot, 14 kernels a layer; on a real model it fetched 0.95x CLOCK's pages where the
    # tier is small)
    eviction: str = "clock"
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
        if self.eviction not in ("value", "clock"):
            raise ValueError(f"eviction must be value or clock, got {self.eviction!r}")
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


# the device-side counters (one int64 tensor, read when TieredKV.stats is asked for)
COUNTERS = ("steps", "selected", "max_selected", "fetched", "evicted", "locality_hits",
            "locality_total", "demand_fetched", "prefetched", "prefetch_hits", "prefetch_waste",
            "recall_hits", "recall_total", "dropped")  # fmt: skip
C = {name: i for i, name in enumerate(COUNTERS)}


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
