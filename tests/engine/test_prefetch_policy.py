"""The "timed" prefetch policy's trials (engine.kv.prefetch_policy), on step times given to
it, and in the engine on the CPU (where the prefetch has nothing to hide behind)."""

import pytest

from engine.kv.prefetch_policy import PrefetchTrials


def run(trials: PrefetchTrials, ms_off: float, ms_on: float, steps: int, size: int = 1):
    """Feed `steps` steps that take ms_off / ms_on by how they ran; returns the modes."""
    modes = []
    for _ in range(steps):
        mode = trials.on
        modes.append(mode)
        trials.observe(ms_on if mode else ms_off, mode, size)
    return modes


@pytest.mark.parametrize("ms_on,want", [(8.0, True), (12.0, False)])
def test_trial_keeps_the_faster_way(ms_on, want):
    t = PrefetchTrials(trial_steps=4, settle_steps=1, retrial_steps=100)
    modes = run(t, 10.0, ms_on, 12)
    # the first step starts the trial; 1 + 4 steps off, then 1 + 4 on, then the decision
    assert modes[:6] == [False] * 6 and modes[6:11] == [True] * 5
    assert t.decisions == [(10.0, ms_on)] and t.on is want and not t.trying
    assert run(t, 10.0, ms_on, 50) == [want] * 50  # settled until the retrial


def test_retrial_follows_a_change():
    t = PrefetchTrials(trial_steps=3, settle_steps=0, retrial_steps=20)
    run(t, 10.0, 8.0, 8)
    assert t.on and len(t.decisions) == 1
    run(t, 10.0, 15.0, 40)  # the prefetch now costs: the next trial turns it off
    assert not t.on and t.decisions[-1] == (10.0, 15.0)


def test_steps_of_the_old_mode_and_other_batches_do_not_count():
    t = PrefetchTrials(trial_steps=2, settle_steps=0)
    t.observe(None, False, 1)  # starts
    t.observe(5.0, True, 1)  # launched before the trial switched it off: ignored
    t.observe(None, False, 1)  # not timed: ignored
    assert t._trial["ms"] == {False: [], True: []}
    t.observe(10.0, False, 1)
    t.observe(99.0, False, 4)  # another batch size: skipped
    assert t._trial["size"] == 1 and t._trial["ms"][False] == [10.0]
    for _ in range(8):  # ... until the trial's size stops coming: a new trial at this one
        t.observe(99.0, False, 4)
    assert t._trial["size"] == 4 and t._trial["ms"][False] == []


def test_alternating_batch_sizes_still_decide():
    """Sizes that alternate (one request joining and leaving) do not stall the trial."""
    t = PrefetchTrials(trial_steps=4, settle_steps=1)
    for i in range(200):
        size = 1 + i % 2
        mode = t.on
        t.observe(10.0 if not mode else 8.0, mode, size)
    assert t.decisions and t.decisions[0] == (10.0, 8.0)
    with pytest.raises(ValueError):
        PrefetchTrials(trial_steps=0)
