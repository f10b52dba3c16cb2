"""Continuous batching with chunked prefill and recompute preemption. Torch-free.

Each step spends a token budget: running decodes first (one token each, lowest latency), then
running prefills continue, then waiting sequences are admitted in FIFO order.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import CacheFullError
from engine.runtime.block_manager import BlockManager
from engine.runtime.sequence import SeqStatus, Sequence


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens to compute this step, starting at seq.num_computed_tokens
    samples: bool  # True when this chunk reaches len(seq): the step samples a next token for it
    # a verification (speculative decoding): the drafted tokens that follow the sequence's
    # last token; num_tokens = 1 + len(draft), and every position's logits are wanted
    draft: tuple[int, ...] = ()

    @property
    def is_decode(self) -> bool:
        # by shape, so it stays true after postprocess moves the sequence on
        return self.num_tokens == 1 and self.samples


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    preempted: list[Sequence]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def num_decodes(self) -> int:
        return sum(1 for s in self.scheduled if s.is_decode)

    @property
    def num_prefills(self) -> int:
        return len(self.scheduled) - self.num_decodes

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        eos_token_ids: set[int] | frozenset[int] = frozenset(),
    ):
        assert max_num_seqs > 0 and max_num_batched_tokens > 0
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: list[Sequence] = []  # FIFO; preempted sequences go back to the front
        self.running: list[Sequence] = []  # admission order: the newest is preempted first

    def add(self, seq: Sequence) -> None:
        if len(seq) == 0:
            raise ValueError("cannot schedule an empty sequence")
        bm = self.block_manager
        # a sequence alone must always fit, or preemption could never make room for it
        # (the last sampled token never needs KV, hence the - 1)
        need = seq.num_blocks_for(len(seq) + seq.params.max_tokens - 1, bm.block_size)
        if need > bm.num_blocks:
            raise CacheFullError(
                f"request needs {need} KV blocks ({len(seq)} prompt + {seq.params.max_tokens} "
                f"new tokens) but the cache holds {bm.num_blocks}"
            )
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput([], [])
        budget = self.max_num_batched_tokens
        for decode_pass in (True, False):
            for seq in list(self.running):
                if budget == 0:
                    break
                if seq.status is not SeqStatus.RUNNING or _is_decoding(seq) is not decode_pass:
                    continue  # preempted earlier in this loop, or handled in the other pass
                n = min(seq.num_uncomputed_tokens, budget)
                if self._reserve(seq, seq.num_computed_tokens + n, out):
                    out.scheduled.append(ScheduledSeq(seq, n, n == seq.num_uncomputed_tokens))
                    budget -= n
        if not out.preempted:  # blocks are short: admitting now would only thrash
            self._admit(budget, out)
        return out

    def _admit(self, budget: int, out: SchedulerOutput) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not bm.can_allocate(seq):
                break  # no overtaking: the head of the queue never starves
            self.waiting.pop(0)
            bm.allocate(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            out.scheduled.append(ScheduledSeq(seq, n, n == seq.num_uncomputed_tokens))
            budget -= n

    def _reserve(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        """Grow seq's blocks to num_tokens, preempting the newest running sequences.
        Returns False when seq itself had to be preempted."""
        while not self.block_manager.ensure_capacity(seq, num_tokens):
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = seq.num_cached_tokens = 0
        seq.status = SeqStatus.WAITING
        self.waiting.insert(0, seq)
        out.preempted.append(seq)
        # a victim scheduled earlier this step no longer has its blocks
        out.scheduled = [s for s in out.scheduled if s.seq is not seq]

    def postprocess(self, out: SchedulerOutput, sampled: dict[int, int]) -> list[Sequence]:
        finished = []
        for item in out.scheduled:
            seq = item.seq
            if seq.is_finished:  # finished from outside (e.g. cancelled) during the step
                continue
            seq.num_computed_tokens += item.num_tokens
            self.block_manager.commit_full_blocks(seq)
            if not item.samples:
                continue
            token = sampled[seq.seq_id]
            seq.append_token(token)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if token in self.eos_token_ids and not seq.params.ignore_eos:
            return "stop"
        if seq.num_completion_tokens >= seq.params.max_tokens:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.is_finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.block_table:
            bs = self.block_manager.block_size
            keep = seq.num_computed_tokens // bs if seq.keep_pages else 0
            self.block_manager.free(seq, keep=keep)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason


def _is_decoding(seq: Sequence) -> bool:
    return seq.num_uncomputed_tokens == 1 and not seq.is_prefilling
