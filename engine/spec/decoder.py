"""Speculative decoding inside the engine's step loop.

For a batch of decoding sequences: each sequence's proposer drafts up to k tokens (k adapted
per sequence), one target forward verifies every sequence's last token and its draft (k+1
positions each; with the tiered cache the k+1 queries share one page selection and one fetch),
and the acceptance rule keeps a prefix of the draft plus one target token. The engine then
commits the emitted tokens one at a time (stop conditions apply between them) and the runner
rolls back what the rejected positions left: their pages, their GPU slots, and (tiered
cache) the page summaries, which fold only the accepted rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.errors import EngineError
from engine.layers.rope import RotaryEmbedding
from engine.layers.sampler import filter_logits, penalize
from engine.loading.loader import (
    build_model,
    init_dummy_weights,
    load_checkpoint_weights,
    read_config,
    resolve_source,
)
from engine.runtime.block_manager import BlockManager
from engine.runtime.model_runner import ModelRunner
from engine.runtime.scheduler import ScheduledSeq, SchedulerOutput
from engine.spec.accept import accept_greedy, accept_sampling
from engine.spec.proposers import (
    AdaptiveLength,
    DraftModel,
    LookupOrSelf,
    LookupProposer,
    Proposer,
    SelfDraft,
)

MODES = ("off", "auto", "lookup", "self", "lookup+self", "draft:PATH")


@dataclass
class SpecConfig:
    """`mode`: "off", "lookup", "self", "lookup+self" (lookup where the context holds a
    continuation, else self), "draft:PATH" (a model the engine can load), or "auto":
    lookup (free when nothing matches; it pays where the answer quotes the context). On the
    CPU a verification's queries now each run their own attention (exact on every CPU), so
    a verification costs ~3x a step there: with the default model on the repository and
    book questions (bench.cpu_spec, docs/benchmarks.md) lookup 0.98x / 0.95x no
    speculation, self 1.05x / 1.13x and lookup+self 0.94x / 1.10x once the draft-length
    policy priced verifications right (0.76x / 0.73x and 0.69x / 0.90x before): within a
    single run's noise of each other. On a GPU a self-draft runs the model eagerly.
    `max_k`: the longest draft; `start_k`: the first draft's length;
    `adaptive`: choose each draft's length from the measured acceptance and step costs
    (AdaptiveLength), else always `start_k`; `window`/`sinks`: the ring of self and draft."""

    mode: str = "auto"
    max_k: int = 8
    start_k: int = 4
    window: int = 256
    sinks: int = 4
    adaptive: bool = True

    def __post_init__(self) -> None:
        named = ("off", "auto", "lookup", "self", "lookup+self")
        if not (self.mode in named or self.mode.startswith("draft:")):
            raise ValueError(f"speculate must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "draft:":
            raise ValueError("draft: needs a model path, e.g. draft:/models/small.gguf")
        if not 1 <= self.max_k <= 16:
            raise ValueError(f"max_k must be in [1, 16], got {self.max_k}")
        if self.window < 1 or self.sinks < 0:
            raise ValueError("window >= 1 and sinks >= 0")


@dataclass(slots=True)
class SpecStats:
    """Per request: verification steps, drafted and accepted tokens, proposer time."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    propose_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Tokens emitted per verification step (accepted drafts + the target's own)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


def make_proposer(cfg: SpecConfig, runner: ModelRunner, cache_dir=None) -> Proposer | None:
    """The proposer `cfg` names, over the target's runner (its model, rope and KV pool); a
    draft model's GGUF converts into `cache_dir` (the engine's, EngineConfig.cache_dir)."""
    mode = cfg.mode
    if mode == "off":
        return None
    if mode == "auto":
        mode = "lookup"
    if mode == "lookup":
        return LookupProposer()
    if mode in ("self", "lookup+self"):
        draft = SelfDraft(runner.model, runner.rope, runner.kv.pool, runner.page_size,
                          cfg.sinks, cfg.window, cfg.max_k)  # fmt: skip
        return draft if mode == "self" else LookupOrSelf(LookupProposer(), draft)
    model, model_cfg = load_draft(mode.removeprefix("draft:"), runner.device, runner.dtype,
                                  cache_dir)  # fmt: skip
    if model_cfg.vocab_size != runner.cfg.vocab_size:
        raise EngineError(
            f"the draft model's vocabulary ({model_cfg.vocab_size} tokens) is not "
            f"the target's ({runner.cfg.vocab_size})"
        )
    rope = RotaryEmbedding(model_cfg, runner.max_model_len, runner.device, runner.dtype)
    return DraftModel(model, rope, cfg.sinks, cfg.window, cfg.max_k)


def load_draft(path: str, device: torch.device, dtype: torch.dtype, cache_dir=None):
    """A draft model's dense weights (what Engine.load takes: a GGUF, a checkpoint, or
    "dummy:PRESET" with the seed-0 random weights) and its config."""
    source = resolve_source(path, cache_dir)
    cfg = read_config(source)
    model = build_model(cfg, device, dtype)
    if source.kind == "dummy":
        init_dummy_weights(model, 0)
    else:
        load_checkpoint_weights(model, source.path)
    return model, cfg


# Steps ahead with lookup drafts (SpecDecoder.ahead_ok): once every sequence of a batch has
# found no continuation in its context for QUIET_PLANS plans in a row, the engine may launch
# up to AHEAD_RUN plain steps each before the previous one's tokens are read (engine_loop:
# the GPU does not wait for the host's bookkeeping), then looks for drafts again. A quote
# that starts meanwhile is drafted at most AHEAD_RUN steps late; the tokens are the same.
QUIET_PLANS = 4
AHEAD_RUN = 8


class SpecDecoder:
    """Drafts and verifies over the target's runner; the block manager gives each
    verification its room (and takes back what the rejected positions held)."""

    def __init__(
        self, runner: ModelRunner, block_manager: BlockManager, cfg: SpecConfig, proposer: Proposer
    ) -> None:
        self.runner, self.block_manager = runner, block_manager
        self.cfg, self.proposer = cfg, proposer
        self.lengths = AdaptiveLength(cfg.start_k, cfg.max_k, fixed=not cfg.adaptive)
        self.generators: dict[int, torch.Generator] = {}
        self.stats: dict[int, SpecStats] = {}
        self.quiet: dict[int, int] = {}  # plans in a row without a draft, per sequence
        self.ahead_run = 0  # plain steps launched ahead since the last plan

    def _generator(self, seq) -> torch.Generator:
        gen = self.generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator()
            if seq.params.seed is not None:
                gen.manual_seed(seq.params.seed + 1)
            else:
                gen.seed()
            self.generators[seq.seq_id] = gen
        return gen

    def plan(self, out) -> tuple[dict[int, list[int]], dict[int, object]] | None:
        """Drafts for a batch of decoding sequences, padded to one length; None when no
        sequence has one (the step runs as a plain decode step) or room is short."""
        items = out.scheduled
        if not items or not all(it.is_decode for it in items):
            return None
        self.ahead_run = 0
        drafts, probs = {}, {}
        for it in items:
            seq = it.seq
            p = seq.params
            room = min(p.max_tokens - seq.num_completion_tokens - 1,
                       self.runner.max_model_len - len(seq))  # fmt: skip
            k = min(self.lengths.get(seq.seq_id), room)
            if k <= 0:
                drafts[seq.seq_id] = []
                self.lengths.update(seq.seq_id, 0, 0)
                self.quiet[seq.seq_id] = self.quiet.get(seq.seq_id, 0) + 1
                continue
            t0 = time.perf_counter()
            d = self.proposer.propose(seq, k, self._generator(seq))
            spent = time.perf_counter() - t0
            self._stats(seq).propose_s += spent
            self.lengths.observe_proposer(len(d.tokens), spent)
            drafts[seq.seq_id] = d.tokens[:k]
            probs[seq.seq_id] = None if d.probs is None else d.probs[:k]
            self.quiet[seq.seq_id] = 0 if d.tokens else self.quiet.get(seq.seq_id, 0) + 1
        width = max(len(d) for d in drafts.values())
        if width == 0:
            return None
        bm = self.block_manager
        for it in items:  # every sequence verifies `width` positions (padding is rejected)
            if not bm.ensure_capacity(it.seq, len(it.seq) + width):
                return None
        return drafts, probs

    def _stats(self, seq) -> SpecStats:
        return self.stats.setdefault(seq.seq_id, SpecStats())

    def verify(self, out, drafts: dict[int, list[int]], probs: dict) -> dict[int, list[int]]:
        """One target forward over every sequence's k+1 positions; returns the emitted tokens
        of each sequence (1 to k+1)."""
        width = max(len(d) for d in drafts.values())
        items = []
        for it in out.scheduled:
            d = drafts[it.seq.seq_id]
            pad = [d[-1] if d else it.seq.token_ids[-1]] * (width - len(d))
            items.append(ScheduledSeq(it.seq, width + 1, True, draft=tuple(d + pad)))
        t0 = time.perf_counter()
        logits = self.runner.verify(SchedulerOutput(items, []))  # [B, k+1, V]
        self.lengths.observe(width + 1, time.perf_counter() - t0)
        emitted = {}
        for i, it in enumerate(out.scheduled):
            seq = it.seq
            d = drafts[seq.seq_id]
            rows = logits[i, : len(d) + 1].float()
            p = seq.params
            if p.repetition_penalty != 1.0:  # position j has generated the draft's first j too
                done = seq.completion_token_ids
                rows = torch.stack([penalize(rows[j], done + d[:j], p.repetition_penalty)
                                    for j in range(len(d) + 1)])  # fmt: skip
            if p.greedy:
                toks = accept_greedy(rows.argmax(-1).tolist(), d)
            else:
                target = torch.softmax(filter_logits(rows / p.temperature, p.top_k, p.top_p), -1)
                q = probs.get(seq.seq_id)
                if q is None:  # deterministic proposals: one-hot rows
                    q = torch.zeros(len(d), rows.shape[-1])
                    q[torch.arange(len(d)), torch.tensor(d, dtype=torch.long)] = 1.0
                toks = accept_sampling(target.cpu(), q, d, self._generator(seq))
            st = self._stats(seq)
            if d:  # (a sequence without a draft was counted idle in plan)
                st.steps += 1
                st.drafted += len(d)
                st.accepted += len(toks) - 1
                self.lengths.update(seq.seq_id, len(d), len(toks) - 1)
                self.proposer.accepted(seq, len(d), len(toks) - 1)
            emitted[seq.seq_id] = toks
        return emitted

    def ahead_ok(self, out) -> bool:
        """Whether the plain step after `out` may be launched before `out`'s tokens are read
        (QUIET_PLANS, AHEAD_RUN above): lookup drafts only (the other proposers always draft),
        every sequence quiet, and the run of steps ahead not yet at its end. Counts it."""
        if not isinstance(self.proposer, LookupProposer) or self.ahead_run >= AHEAD_RUN:
            return False
        if any(self.quiet.get(it.seq.seq_id, 0) < QUIET_PLANS for it in out.scheduled):
            return False
        self.ahead_run += 1
        return True

    def observe_plain_step(self, seconds: float) -> None:
        """The engine ran a plain decode step (no draft): its time is the unit of cost."""
        self.lengths.observe(1, seconds)

    def release(self, seq_id: int) -> SpecStats | None:
        self.proposer.release(seq_id)
        self.lengths.release(seq_id)
        self.generators.pop(seq_id, None)
        self.quiet.pop(seq_id, None)
        return self.stats.pop(seq_id, None)
