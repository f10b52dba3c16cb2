"""Which top-k method (kernels.page_topk) a selection runs: on a GPU, each method is timed once
per shape, outside CUDA-graph capture, and the fastest kept. Their speeds depend on the
scores' spread and the row count, so no fixed rule holds (docs/benchmarks.md,
bench.select_bench)."""

from __future__ import annotations

import torch

from kernels import HAS_TRITON
from kernels.page_topk import MAX_PAGES, select_pages
from kernels.views import SelectRule


class SelectMethods:
    """The fastest select method per shape (rows, pages, budget, width), timed at its first
    call. `only`: every selection by this method instead (a benchmark's choice)."""

    def __init__(self, only: str | None = None) -> None:
        self.only = only
        self._chosen: dict[tuple, str] = {}
        self._times: dict[tuple, dict[str, float]] = {}

    def chosen_methods(self) -> dict[tuple, str]:
        """(rows, pages, budget, width) -> the method picked for that shape."""
        return dict(self._chosen)

    def method_times(self) -> dict[tuple, dict[str, float]]:
        """The same keys -> each candidate's best time (ms for 5 calls)."""
        return {k: dict(v) for k, v in self._times.items()}

    def method_for(self, scores: torch.Tensor, kv_lens: torch.Tensor, rule: SelectRule,
                   budgets: torch.Tensor | None = None) -> str:  # fmt: skip
        """The method for this selection: the fastest for its shape, timed now if it is new
        and this is not a capture; on the CPU or inside a capture of an untimed shape, the
        probe kernel (or torch past its rows)."""
        if self.only is not None:
            return self.only
        B, Hkv, M = scores.shape
        key = (B * Hkv, M, rule.budget, rule.width)
        if key in self._chosen:
            return self._chosen[key]
        capturing = scores.is_cuda and torch.cuda.is_current_stream_capturing()
        if rule.width is None or not HAS_TRITON or not scores.is_cuda or capturing:
            return "probe2" if MAX_PAGES["probe2"] >= M else "torch"
        candidates = ["torch"] + [m for m, most in MAX_PAGES.items() if most >= M] + ["split"]
        times = _time_methods(candidates, scores, kv_lens, rule, budgets)
        self._times[key] = times
        self._chosen[key] = min(times, key=times.get)
        return self._chosen[key]


def _time_methods(candidates: list[str], scores, kv_lens, rule: SelectRule,
                  budgets) -> dict[str, float]:  # fmt: skip
    """Each method's best of three interleaved rounds of 5 calls (ms): one round's noise
    (other work on the GPU at the first call) once picked a method at 1.6x the fastest's
    time. Timed in CUDA graphs, as decode steps run them: eagerly, the split select's 7
    launches would be timed at Python's launch rate, not the GPU's."""

    def call(m: str):
        return select_pages(scores, kv_lens, rule, budgets, method=m)

    built = []
    for m in candidates:
        try:
            call(m)  # compile
        except Exception:  # noqa: BLE001 (a kernel this GPU or Triton cannot build: skip it)
            continue
        built.append(m)
    graphs = {m: graph_of(lambda m=m: call(m), reps=5) for m in built}
    times = dict.fromkeys(built, float("inf"))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        for m in built:
            start.record()
            if graphs[m] is not None:
                graphs[m].replay()
            else:
                for _ in range(5):
                    call(m)
            end.record()
            end.synchronize()
            times[m] = min(times[m], start.elapsed_time(end))
    return times


def graph_of(fn, reps: int = 1):
    """`reps` calls of fn captured in one CUDA graph (to replay), or None where capture
    fails (a torch op that syncs, say)."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        return graph
    except RuntimeError:
        return None
