"""Proposers for speculative decoding, behind one small interface, and the adaptive draft
length.

- `LookupProposer`: n-gram matches in the sequence's own tokens (engine.spec.lookup); free
  to run, strong where the answer quotes the context (code, a book's sentences).
- `SelfDraft`: the target model itself attending only to a ring of the sinks and the last W
  positions (engine.spec.ring). The ring holds the target's own exact KV of those positions,
  copied from the paged pool after each verification; only the tokens being drafted get KV
  computed with the window alone.
- `DraftModel`: a separate small model of the same tokenizer with its own ring: it reads the
  sinks and the last W tokens of the context when it starts, then the accepted tokens.

A proposer returns up to k tokens and, when it samples, its distribution at each of them
(the rejection rule needs q(x)); a deterministic proposer returns none (one-hot rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.layers.sampler import filter_logits
from engine.spec.lookup import PromptLookup, TokenHistory
from engine.spec.ring import RingKV, ring_forward
from engine.spec.ring_graph import RingStepGraph


@dataclass(slots=True)
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None = None  # [k, V] on the CPU; None: deterministic proposals


class Proposer:
    name = "?"

    def propose(self, seq, k: int, generator: torch.Generator | None = None) -> Draft:
        raise NotImplementedError

    def accepted(self, seq, drafted: int, accepted: int) -> None:
        """The target accepted `accepted` of the `drafted` tokens (seq already extended)."""

    def release(self, seq_id: int) -> None:
        """The sequence is gone: drop what is kept for it."""

    def memory_bytes(self) -> int:
        return 0


class LookupProposer(Proposer):
    name = "lookup"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2) -> None:
        self.lookup = PromptLookup(max_ngram, min_ngram)
        self.histories: dict[int, TokenHistory] = {}

    def propose(self, seq, k: int, generator: torch.Generator | None = None) -> Draft:
        history = self.histories.setdefault(seq.seq_id, TokenHistory())
        return Draft(self.lookup.propose(history.sync(seq.token_ids), k))

    def release(self, seq_id: int) -> None:
        self.histories.pop(seq_id, None)

    def memory_bytes(self) -> int:
        return sum(h.buf.nbytes for h in self.histories.values())


class LookupOrSelf(Proposer):
    """Prompt lookup where the context holds a continuation (free, and long when the answer
    quotes), else the model's own draft over its window (`SelfDraft`)."""

    name = "lookup+self"

    def __init__(self, lookup: LookupProposer, draft: SelfDraft, min_match: int = 2) -> None:
        self.lookup, self.draft, self.min_match = lookup, draft, min_match

    def propose(self, seq, k: int, generator: torch.Generator | None = None) -> Draft:
        found = self.lookup.propose(seq, k)
        if len(found.tokens) >= min(k, self.min_match):
            return found
        return self.draft.propose(seq, k, generator)

    def release(self, seq_id: int) -> None:
        self.lookup.release(seq_id)
        self.draft.release(seq_id)

    def memory_bytes(self) -> int:
        return self.lookup.memory_bytes() + self.draft.memory_bytes()


class _RingDrafter(Proposer):
    """Drafts with `model` over a RingKV per sequence; subclasses say how the ring learns the
    context (`_sync`) and what happens to the drafted entries after verification."""

    def __init__(self, model, rope, sinks: int, window: int, max_k: int, device, dtype) -> None:
        self.model, self.rope = model, rope
        self.sinks, self.window, self.max_k = sinks, window, max_k
        self.device, self.dtype = device, dtype
        cfg = model.cfg
        self.shape = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        self.rings: dict[int, RingKV] = {}
        # greedy drafts through a step graph per ring (engine.spec.ring_graph) on a GPU,
        # where one eager token's launches cost more than the target's decode step; `graphs`
        # True with `capture` False runs the same steps eagerly (a check on the CPU)
        self.graphs = self.capture = torch.device(device).type == "cuda"
        self.steppers: dict[int, RingStepGraph] = {}
        self._pool = None

    def _ring(self, seq) -> RingKV:
        ring = self.rings.get(seq.seq_id)
        if ring is None:
            L, Hkv, D = self.shape
            ring = RingKV(L, Hkv, D, self.sinks, self.window, self.max_k + 1, self.device,
                          self.dtype)  # fmt: skip
            self.rings[seq.seq_id] = ring
        return ring

    def memory_bytes(self) -> int:
        return sum(r.nbytes for r in self.rings.values())

    def release(self, seq_id: int) -> None:
        self.rings.pop(seq_id, None)
        self.steppers.pop(seq_id, None)

    def _greedy_steps(self, seq, ring: RingKV, ids: list[int], positions: list[int],
                      to_tail: bool, k: int) -> list[int]:  # fmt: skip
        """A greedy draft through the ring's step graph (RingStepGraph): a first pass of
        several tokens runs eagerly, every one-token pass replays the graph."""
        g = self.steppers.get(seq.seq_id)
        if g is None:
            if self._pool is None and self.capture:
                self._pool = torch.cuda.graph_pool_handle()
            g = RingStepGraph(self.model, self.rope, ring, self.max_k, self._pool, self.capture)
            self.steppers[seq.seq_id] = g
        k = min(k, self.max_k)
        if len(ids) == 1:
            dest = ring.tail_index(1)[0] if to_tail else ring.ring_index(positions)[0]
            return g.draft(ids[0], positions[0], dest, k, to_tail)
        first = int(ring_forward(self.model, self.rope, ring, ids, positions, to_tail).argmax())
        if k == 1:
            return [first]
        return [first] + g.draft(first, positions[-1] + 1, ring.tail_index(1)[0], k - 1, True)

    def _sync(self, seq, ring: RingKV) -> tuple[list[int], list[int], bool]:
        """Bring the ring up to the context; returns the tokens and positions of the first
        draft forward and whether they go to the tail."""
        raise NotImplementedError

    def propose(self, seq, k: int, generator: torch.Generator | None = None) -> Draft:
        ring = self._ring(seq)
        ring.clear_tail()
        ids, positions, to_tail = self._sync(seq, ring)
        params = seq.params
        if params.greedy and self.graphs:
            return Draft(self._greedy_steps(seq, ring, ids, positions, to_tail, k), None)
        tokens, rows = [], []
        for i in range(min(k, self.max_k)):
            logits = ring_forward(self.model, self.rope, ring, ids, positions, to_tail)
            if params.greedy:
                token = int(logits.argmax())
            else:
                probs = torch.softmax(
                    filter_logits(logits / params.temperature, params.top_k, params.top_p), -1
                ).cpu()
                token = int(torch.multinomial(probs, 1, generator=generator))
                rows.append(probs)
            tokens.append(token)
            if i + 1 < k:
                ids, positions, to_tail = [token], [positions[-1] + 1], True
        return Draft(tokens, torch.stack(rows) if rows else None)


class SelfDraft(_RingDrafter):
    """The target drafts for itself over the sinks and its last W positions. `pool`: the
    target's paged KV [L, pages, Hkv, 2, P, D] (its exact KV is copied into the ring)."""

    name = "self"

    def __init__(self, model, rope, pool: torch.Tensor, page_size: int, sinks: int = 4,
                 window: int = 256, max_k: int = 8) -> None:  # fmt: skip
        dev = next(model.parameters()).device
        super().__init__(model, rope, sinks, window, max_k, dev, pool.dtype)
        self.pool, self.P = pool, page_size

    def _sync(self, seq, ring: RingKV):
        end = seq.num_computed_tokens  # the target's KV holds positions [0, end)
        want = [p for p in range(ring.next_pos, end) if p < ring.S or p >= end - ring.W]
        if want:
            dev = self.pool.device
            pages = torch.tensor([seq.block_table[p // self.P] for p in want], device=dev)
            offs = torch.tensor([p % self.P for p in want], device=dev)
            rows = self.pool.permute(0, 1, 4, 2, 3, 5)[:, pages, offs]  # [L, T, Hkv, 2, D]
            ring.store(rows[..., 0, :].to(self.device), rows[..., 1, :].to(self.device), want)
        ring.next_pos = end
        # the last token has no KV in the target yet: draft from it in the tail
        return seq.token_ids[end:], list(range(end, len(seq))), True


class DraftModel(_RingDrafter):
    """A separate model of the same tokenizer (`model` a CausalLM, `rope` its rotary table)
    drafting over its own ring."""

    name = "draft"

    def __init__(self, model, rope, sinks: int = 4, window: int = 256, max_k: int = 8) -> None:
        p = next(model.parameters())
        super().__init__(model, rope, sinks, window, max_k, p.device, p.dtype)
        self.pending: dict[int, int] = {}  # seq -> drafted tokens to keep after verification

    def _sync(self, seq, ring: RingKV):
        # every token of the sequence is final: read those the ring has not seen (of a long
        # stretch, the sinks and the last W: ring_forward stores only those)
        start = ring.next_pos
        n = len(seq)
        positions = list(range(start, n))
        if len(positions) > ring.S + ring.W:
            positions = [p for p in positions if p < ring.S] + list(range(n - ring.W, n))
        ring.next_pos = n
        return [seq.token_ids[p] for p in positions], positions, False

    def accepted(self, seq, drafted: int, accepted: int) -> None:
        ring = self.rings.get(seq.seq_id)
        if ring is None:
            return
        # the tail holds the KV of the drafted tokens that were fed back (all but the last):
        # the accepted ones among them are context now
        keep = min(accepted, ring.tail_len)
        ring.commit_tail(keep)
        ring.next_pos += keep
        ring.clear_tail()


class AdaptiveLength:
    """The draft length per sequence, from what a draft is worth on this machine.

    Each sequence keeps an estimate of the chance `a` that a drafted token is accepted (an
    average over its recent drafts); the decoder reports how long steps take: a plain decode
    step, a verification of T positions, and the proposer's time per drafted token. A
    draft of k tokens is expected to yield 1 + a + ... + a^k tokens for one verification of
    k+1 positions plus k proposals; the length chosen is the k (0 to max_k) with the most
    tokens per second. Acceptances raise `a` and so the length; rejections lower both, down
    to 0 (no draft: a plain step) where drafting does not pay, with a one-token probe every
    `probe` steps so that a sequence can come back, unless even a fully accepted draft
    would not pay (a verification eagerly run against CUDA-graph steps, say). A
    verification of T positions is taken to cost 1 + b (T - 1) plain steps until that T is
    measured, b fitted to the measured ones (0.2 before any); a plain step's time, the
    unit, is extrapolated from the verifications' where none was timed."""

    def __init__(self, start: int = 4, max_k: int = 8, probe: int = 16, fixed: bool = False):
        self.start, self.max_k, self.probe, self.fixed = min(start, max_k), max_k, probe, fixed
        self.accept: dict[int, float] = {}
        self.idle: dict[int, int] = {}  # steps since the sequence last drafted
        self.step_s: dict[int, float] = {}  # T -> seconds per step (a moving average)
        self.propose_s = 0.0  # seconds per drafted token

    def observe(self, positions: int, seconds: float) -> None:
        """A step of `positions` query tokens per sequence took `seconds`."""
        old = self.step_s.get(positions)
        self.step_s[positions] = seconds if old is None else 0.8 * old + 0.2 * seconds

    def observe_proposer(self, tokens: int, seconds: float) -> None:
        if tokens:
            per = seconds / tokens
            self.propose_s = per if not self.propose_s else 0.8 * self.propose_s + 0.2 * per

    def _base(self) -> float | None:
        """Seconds of a plain step: measured, else (a run that drafts at every step never
        times one) extrapolated to one position from verifications of two or more lengths,
        whose time is about affine in their positions (CPU, default model: 59-72 ms at 2
        positions, 115-145 ms at 5, against 40-47 ms for a plain step); None before that."""
        base = self.step_s.get(1)
        if base:
            return base
        pts = sorted(self.step_s.items())
        if len(pts) < 2:
            return None
        mt = sum(t for t, _ in pts) / len(pts)
        ms = sum(s for _, s in pts) / len(pts)
        slope = sum((t - mt) * (s - ms) for t, s in pts) / sum((t - mt) ** 2 for t, _ in pts)
        est = ms + slope * (1 - mt)
        return min(est, pts[0][1]) if est > 0 else None

    def _cost(self, T: int) -> float:
        """Seconds of a verification of T positions, in plain-step units."""
        base = self._base()
        if base and T in self.step_s:
            return self.step_s[T] / base
        slopes = [(t / base - 1) / (n - 1) for n, t in self.step_s.items() if n > 1 and base]
        return 1.0 + (sum(slopes) / len(slopes) if slopes else 0.2) * (T - 1)

    def get(self, seq_id: int) -> int:
        a = self.accept.get(seq_id)
        if a is None or self.fixed:
            return self.start
        base = self._base()
        per_token = self.propose_s / base if base else 0.0
        best_k, best, ceiling = 0, 1.0, 0.0  # k = 0: a plain step, one token per step
        for k in range(1, self.max_k + 1):
            tokens = sum(a**i for i in range(k + 1))
            spent = self._cost(k + 1) + k * per_token
            ceiling = max(ceiling, (k + 1) / spent)  # every draft token accepted
            if tokens / spent > best * 1.02:  # a longer draft must be clearly worth it
                best_k, best = k, tokens / spent
        if best_k == 0 and ceiling > 1.02 and self.idle.get(seq_id, 0) >= self.probe:
            return 1
        return best_k

    def update(self, seq_id: int, drafted: int, accepted: int) -> None:
        if drafted == 0:
            self.idle[seq_id] = self.idle.get(seq_id, 0) + 1
            return
        self.idle[seq_id] = 0
        rate = accepted / drafted
        old = self.accept.get(seq_id)
        self.accept[seq_id] = rate if old is None else 0.7 * old + 0.3 * rate

    def release(self, seq_id: int) -> None:
        self.accept.pop(seq_id, None)
        self.idle.pop(seq_id, None)
