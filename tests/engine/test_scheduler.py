from __future__ import annotations

import pytest

from engine.errors import CacheFullError
from engine.runtime.block_manager import BlockManager
from engine.runtime.scheduler import Scheduler, SchedulerOutput
from engine.runtime.sequence import SeqStatus, Sequence
from engine.sampling_params import SamplingParams

BS = 4


def make(num_blocks: int = 64, **kw) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BS), **kw)


def new_seq(n: int, max_tokens: int = 4, start: int = 0, **kw) -> Sequence:
    return Sequence(list(range(start, start + n)), SamplingParams(max_tokens=max_tokens, **kw))


def step(sched: Scheduler, token: int = 7) -> tuple[SchedulerOutput, list[Sequence]]:
    """One engine step with a fake model that always samples `token`."""
    out = sched.schedule()
    assert out.num_tokens <= sched.max_num_batched_tokens
    assert len(sched.running) <= sched.max_num_seqs
    sampled = {s.seq.seq_id: token for s in out.scheduled if s.samples}
    return out, sched.postprocess(out, sampled)


def run_all(sched: Scheduler, max_steps: int = 200) -> list[Sequence]:
    done: list[Sequence] = []
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return done
        done += step(sched)[1]
    raise AssertionError("did not finish")


def chunks(out: SchedulerOutput) -> list[tuple[int, int, bool]]:
    return [(s.seq.seq_id, s.num_tokens, s.samples) for s in out.scheduled]


def test_long_prompt_is_prefilled_in_chunks():
    sched = make(max_num_batched_tokens=8)
    seq = new_seq(20, max_tokens=2)
    sched.add(seq)
    sizes = []
    for _ in range(3):
        out, _ = step(sched)
        sizes.append(chunks(out))
    sid = seq.seq_id
    assert sizes == [[(sid, 8, False)], [(sid, 8, False)], [(sid, 4, True)]]
    assert seq.num_computed_tokens == 20 and seq.completion_token_ids == [7]
    out, finished = step(sched)
    assert chunks(out) == [(sid, 1, True)] and out.num_decodes == 1
    assert finished == [seq] and seq.finish_reason == "length"
    assert sched.block_manager.num_free_blocks == 64


def test_step_mixes_decodes_and_a_prefill_chunk():
    sched = make(max_num_batched_tokens=8)
    a = new_seq(3, max_tokens=10)
    sched.add(a)
    step(sched)
    b = new_seq(20, max_tokens=1, start=100)
    sched.add(b)
    out, _ = step(sched)
    assert chunks(out) == [(a.seq_id, 1, True), (b.seq_id, 7, False)]
    assert (out.num_decodes, out.num_prefills, out.num_tokens) == (1, 1, 8)
    out, _ = step(sched)
    assert chunks(out) == [(a.seq_id, 1, True), (b.seq_id, 7, False)]
    out, finished = step(sched)
    assert chunks(out) == [(a.seq_id, 1, True), (b.seq_id, 6, True)]
    assert finished == [b]
    assert a.num_completion_tokens == 4


def test_fifo_long_prompt_is_not_starved_by_later_short_ones():
    sched = make(num_blocks=8, max_num_batched_tokens=8)
    s1, s2 = new_seq(4, start=0), new_seq(4, start=10)
    sched.add(s1)
    sched.add(s2)
    step(sched)
    long = new_seq(20, max_tokens=2, start=100)  # 5 blocks: cannot fit beside s1 and s2
    sched.add(long)
    shorts = []
    while long.status is SeqStatus.WAITING:
        short = new_seq(3, start=200 + 10 * len(shorts))  # would fit, must not overtake
        shorts.append(short)
        sched.add(short)
        step(sched)
        assert all(s.status is SeqStatus.WAITING for s in shorts)
        assert len(shorts) < 10
    assert s1.is_finished and s2.is_finished
    assert sched.waiting == shorts
    done = run_all(sched)
    assert long in done and long.finish_reason == "length"
    assert all(s.is_finished for s in shorts)
    assert sched.block_manager.num_free_blocks == 8


def test_preemption_when_blocks_run_out_and_victim_recomputes():
    sched = make(num_blocks=4, max_num_batched_tokens=16)
    a = new_seq(4, max_tokens=8, start=0)
    b = new_seq(4, max_tokens=8, start=100)
    sched.add(a)
    sched.add(b)
    preempted_at = None
    for i in range(20):
        out, _ = step(sched)
        if out.preempted:
            preempted_at = i
            assert out.preempted == [b]  # the most recently admitted one
            assert chunks(out) == [(a.seq_id, 1, True)]
            assert sched.waiting[0] is b and b.status is SeqStatus.WAITING
            assert b.block_table == [] and b.num_computed_tokens == 0
            break
    assert preempted_at is not None
    generated = b.num_completion_tokens
    run_all(sched)
    assert a.finish_reason == b.finish_reason == "length"
    assert a.completion_token_ids == b.completion_token_ids == [7] * 8
    assert generated > 0
    assert sched.block_manager.num_free_blocks == 4


def test_sequence_preempts_itself_when_it_is_the_newest():
    sched = make(num_blocks=3, max_num_batched_tokens=16)
    a = new_seq(4, max_tokens=5, start=0)
    b = new_seq(3, max_tokens=5, start=100)
    sched.add(a)
    sched.add(b)
    step(sched)  # a: 1 block, b: 1 block
    out, _ = step(sched)  # a grows into the last free block
    assert not out.preempted
    out, _ = step(sched)  # b needs a block: b is the newest, so b goes
    assert out.preempted == [b] and chunks(out) == [(a.seq_id, 1, True)]
    run_all(sched)
    assert a.is_finished and b.is_finished and b.num_completion_tokens == 5


def test_max_num_seqs_is_respected():
    sched = make(max_num_seqs=2)
    seqs = [new_seq(3, start=10 * i) for i in range(4)]
    for s in seqs:
        sched.add(s)
    out, _ = step(sched)
    assert [s.seq for s in out.scheduled] == seqs[:2]
    assert sched.running == seqs[:2] and sched.waiting == seqs[2:]
    run_all(sched)
    assert all(s.is_finished for s in seqs)


def test_eos_finishes_with_stop():
    sched = make(eos_token_ids={7})
    seq = new_seq(5, max_tokens=10)
    sched.add(seq)
    _, finished = step(sched)
    assert finished == [seq] and seq.finish_reason == "stop"
    assert seq.completion_token_ids == [7] and not sched.has_unfinished()
    assert sched.block_manager.num_free_blocks == 64


def test_ignore_eos_runs_to_max_tokens():
    sched = make(eos_token_ids={7})
    seq = new_seq(5, max_tokens=3, ignore_eos=True)
    sched.add(seq)
    done = run_all(sched)
    assert done == [seq] and seq.finish_reason == "length"
    assert seq.completion_token_ids == [7, 7, 7]


def test_finish_on_waiting_running_and_finished_sequences():
    sched = make(max_num_seqs=1)
    a, b = new_seq(5), new_seq(5, start=50)
    sched.add(a)
    sched.add(b)
    out, _ = step(sched)
    sched.finish(b, "cancelled")
    assert b.is_finished and b.finish_reason == "cancelled" and sched.waiting == []
    sched.finish(b, "stop")  # already finished: no-op
    assert b.finish_reason == "cancelled"
    out = sched.schedule()
    sched.finish(a, "stop")  # e.g. a stop string matched while the step ran
    assert a.block_table == [] and sched.running == []
    assert sched.postprocess(out, {a.seq_id: 7}) == []
    assert a.num_completion_tokens == 1 and not sched.has_unfinished()
    assert sched.block_manager.num_free_blocks == 64


def test_prefix_cache_hit_skips_computed_pages():
    sched = make(max_num_batched_tokens=64)
    a = new_seq(10, max_tokens=1)
    sched.add(a)
    run_all(sched)
    b = new_seq(10, max_tokens=1)  # same prompt: two cached pages
    sched.add(b)
    out, _ = step(sched)
    assert chunks(out) == [(b.seq_id, 2, True)] and b.num_cached_tokens == 8
    c = new_seq(8, max_tokens=1)  # fully cached: the last page is recomputed for logits
    sched.add(c)
    out, _ = step(sched)
    assert chunks(out) == [(c.seq_id, 4, True)]


def test_add_rejects_requests_larger_than_the_cache():
    sched = make(num_blocks=4)
    with pytest.raises(CacheFullError):
        sched.add(new_seq(10, max_tokens=8))  # 17 tokens of KV > 16 slots
    sched.add(new_seq(10, max_tokens=7))
