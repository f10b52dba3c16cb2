"""The "timed" Forecast prefetch policy: prefetch only where it makes decode steps faster,
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
