"""When decode steps run the Forecast prefetch (`PrefetchPolicy`: "always", or "auto" by
how much the steps need from the host, or "timed"), and the "timed" policy: prefetch only where it makes decode steps faster,
as measured on this machine, for this context.

Whether the prefetch pays depends on more than the bytes a step needs from the host: on the
H200 it made a 128K worst-case step 1.18x faster, a 128K realistic one 0.93x, and at 500K
both lost (0.88x and 0.70x: its side chain of prediction, selection and staging outgrew
the layer it hides behind; one H200 run). So, while the steps need the
host at all (the "auto" policy's moving average of MiB per layer-step above its threshold),
this policy times both ways: `trial_steps` steps without the prefetch, then as many with
it (each after `settle_steps` it throws away: the first step of a mode may capture a CUDA
graph, and steps launched before the switch still run the old way), keeps the faster by
the medians, and tries again `retrial_steps` steps after each decision (the context grows,
the batch changes). Steps of a batch size other than the trial's are skipped; a trial
whose size stops coming starts again at the size that does.
"""

from __future__ import annotations

import statistics

import torch

from engine.kv.sparse_config import C, SparseConfig


class PrefetchPolicy:
    """Whether the next steps prefetch: "always"; "auto": while the steps need many pages
    from the host (a moving average of MiB per layer-step, with hysteresis); "timed": as
    "auto", then by timing steps both ways (PrefetchTrials)."""

    def __init__(self, sparse: SparseConfig, acc: torch.Tensor, unit_bytes: int,
                 device: torch.device) -> None:  # fmt: skip
        self.sparse, self.acc, self.unit_bytes = sparse, acc, unit_bytes
        # whether the next steps prefetch, what the last steps needed from the host (MiB
        # per layer-step, a moving average), and the counters it last read (steps, demand
        # fetches, prefetch hits: a pinned copy read after a step)
        self.prefetch_on = sparse.prefetch_policy == "always"
        self.need_mib: float | None = None
        self.need_high = False  # "timed": the steps need the host (auto's hysteresis)
        self.trials = PrefetchTrials(sparse.trial_steps, retrial_steps=sparse.retrial_steps)
        self.seen = (0, 0, 0)
        self.host = torch.zeros(2, 3, dtype=torch.long, pin_memory=device.type == "cuda")
        self._idx = torch.tensor([C["steps"], C["demand_fetched"], C["prefetch_hits"]],
                                 device=device)  # fmt: skip

    def prefetching(self) -> bool:
        """Whether decode steps prefetch now (a forecast, and the policy says so)."""
        sp = self.sparse
        return sp.forecast != "off" and (sp.prefetch_policy == "always" or self.prefetch_on)

    def read(self, turn: int = 0, wait: bool = False) -> None:
        """Copy the counters the policy reads into the host buffer of `turn` (one per step
        in flight), after a step's kernels: queued (`wait` False: `update(turn)` reads it
        once that step is known to be done, e.g. its tokens' event) or now."""
        if self.sparse.prefetch_policy != "always" and self.sparse.forecast != "off":
            self.host[turn].copy_(self.acc[self._idx], non_blocking=not wait)

    def reset(self) -> None:
        """Forget what the policy measured (benchmarks: each run starts as a fresh engine)."""
        self.prefetch_on = self.sparse.prefetch_policy == "always"
        self.need_mib, self.need_high = None, False
        self.trials.reset()

    def counters_reset(self) -> None:
        self.seen = (0, 0, 0)  # (the last reading: before the reset)
        self.host.zero_()

    def update(self, turn: int = 0, step_ms: float | None = None, prefetched: bool = False,
               size: int = 1) -> None:  # fmt: skip
        """After a step that `read(turn)` followed is done: the pages it needed from the
        host per layer (on demand or from the stage), into the moving average, and the
        prefetch on or off: by the thresholds (with hysteresis), and for "timed" then by
        the step times (`step_ms`, of a step that `prefetched` or not, of `size` sequences)."""
        sp = self.sparse
        if sp.prefetch_policy == "always" or sp.forecast == "off":
            return
        now = tuple(self.host[turn].tolist())
        if now[0] < self.seen[0]:  # the counters were reset
            self.seen = (0, 0, 0)
        steps = now[0] - self.seen[0]
        if steps <= 0:
            return
        units = (now[1] - self.seen[1]) + (now[2] - self.seen[2])
        self.seen = now
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


class PrefetchTrials:
    def __init__(self, trial_steps: int = 8, settle_steps: int = 2, retrial_steps: int = 512):
        if trial_steps < 1 or settle_steps < 0 or retrial_steps < 1:
            raise ValueError("trial_steps >= 1, settle_steps >= 0, retrial_steps >= 1")
        self.trial_steps, self.settle_steps, self.retrial_steps = (
            trial_steps, settle_steps, retrial_steps,
        )  # fmt: skip
        self.on = False  # whether the next steps prefetch
        self.decisions: list[tuple[float, float]] = []  # (median ms off, on) per trial
        self._trial: dict | None = None
        self._since = 0  # steps since the last decision

    @property
    def trying(self) -> bool:
        return self._trial is not None

    def reset(self) -> None:
        """The steps no longer need the host: no prefetch, and a trial when they do again."""
        self.on, self._trial, self._since = False, None, 0
        self.decisions.clear()

    def observe(self, step_ms: float | None, prefetched: bool, size: int) -> None:
        """One finished decode step (`step_ms` None: not timed), whose steps need the host:
        starts, advances or ends a trial; sets `on` for the steps launched next."""
        if self._trial is None:
            self._since += 1
            if self.decisions and self._since < self.retrial_steps:
                return
            self._start(size)
            return
        t = self._trial
        if size != t["size"]:  # another batch size: its steps are not comparable, skipped;
            t["other"] += 1  # a trial whose size stopped coming starts again at this one
            if t["other"] > 4 * (self.trial_steps + self.settle_steps):
                self._start(size)
            return
        if step_ms is None or prefetched != self.on:  # launched before the switch
            return
        if t["settle"] > 0:
            t["settle"] -= 1
            return
        t["ms"][self.on].append(step_ms)
        if len(t["ms"][self.on]) < self.trial_steps:
            return
        if not self.on:  # now the same number with the prefetch
            self.on, t["settle"] = True, self.settle_steps
            return
        off, on = (statistics.median(t["ms"][k]) for k in (False, True))
        self.decisions.append((off, on))
        self.on, self._trial, self._since = on < off, None, 0

    def _start(self, size: int) -> None:
        self.on = False
        self._trial = {"size": size, "settle": self.settle_steps, "other": 0,
                       "ms": {False: [], True: []}}  # fmt: skip
