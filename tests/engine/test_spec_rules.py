"""Speculative decoding's building blocks: the greedy and the sampling acceptance rules, and
the prompt-lookup proposer."""

from __future__ import annotations

import torch

from engine.spec.accept import accept_greedy, accept_sampling
from engine.spec.lookup import PromptLookup


def test_greedy_acceptance_is_the_targets_greedy_output():
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted + bonus
    assert accept_greedy([5, 9, 7, 8], [5, 6, 7]) == [5, 9]  # first mismatch replaced
    assert accept_greedy([4, 6, 7, 8], [5, 6, 7]) == [4]
    assert accept_greedy([3], []) == [3]


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_sampling_acceptance_preserves_the_target_distribution():
    """A small vocabulary, a draft distribution unlike the target's: over many seeded runs the
    first emitted token and the second (given the first was accepted) follow the target.
    Chi-square critical value at 7 degrees of freedom, p = 0.001: 24.32."""
    g = torch.Generator().manual_seed(0)
    V, k, runs = 8, 2, 20000
    p = torch.softmax(torch.randn(k + 1, V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(k, V, generator=g) * 1.5, -1)
    first = torch.zeros(V)
    second = torch.zeros(V)
    for _ in range(runs):
        draft = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(k)]
        out = accept_sampling(p, q, draft, generator=g)
        first[out[0]] += 1
        if len(out) > 1:  # draft[0] accepted: the next token is from p[1]
            second[out[1]] += 1
    assert chi_square(first, p[0]) < 24.32
    assert chi_square(second, p[1]) < 24.32
    # and the test can fail: the draft distribution itself is far from the target's
    assert chi_square(first, q[0]) > 100


def test_one_hot_drafts_from_prompt_lookup_are_accepted_at_the_targets_rate():
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    q = torch.tensor([[1.0, 0.0, 0.0]])  # the lookup proposed token 0
    accepted = sum(accept_sampling(p, q, [0], generator=g)[0] == 0 for _ in range(5000))
    assert abs(accepted / 5000 - 0.7) < 0.03


def test_prompt_lookup_continues_the_latest_match():
    lookup = PromptLookup(max_ngram=3, min_ngram=1)
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup.propose(tokens, 2) == [7, 8]  # the latest earlier "1 2 3" went on "7 8"
    assert lookup.propose([4, 5, 6], 3) == []  # nothing repeats
    # a match near the end runs on into its own proposal (a repeating pattern)
    assert lookup.propose([1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]
    assert PromptLookup(min_ngram=2).propose([1, 5, 1], 2) == []  # a 1-gram is too short


def test_prompt_lookup_equals_the_plain_scan_on_random_sequences():
    import random

    from engine.spec.lookup import TokenHistory, propose_by_scan

    rng = random.Random(0)
    found = 0
    for _ in range(400):
        vocab = rng.choice([2, 3, 5, 20])  # small alphabets repeat n-grams often
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 60))]
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        k = rng.randint(1, 8)
        want = propose_by_scan(tokens, k, hi, lo)
        lookup = PromptLookup(max_ngram=hi, min_ngram=lo)
        assert lookup.propose(tokens, k) == want, (tokens, k, hi, lo)
        # the same through a history that grows token by token, as a sequence's does
        history = TokenHistory()
        for m in range(len(tokens) + 1):
            history.sync(tokens[:m])
        assert lookup.propose(history.sync(tokens), k) == want
        found += bool(want)
    assert found > 200  # most trials found a match: the comparison is not of empty lists


def test_token_history_follows_appends_and_starts_over_on_a_new_list():
    from engine.spec.lookup import TokenHistory

    h = TokenHistory()
    assert h.sync([]).tolist() == []
    assert h.sync([1, 2, 3]).tolist() == [1, 2, 3]
    big = list(range(5000))
    assert h.sync([1, 2, 3] + big).tolist() == [1, 2, 3] + big  # grows past its buffer
    assert h.sync([7, 8]).tolist() == [7, 8]  # shorter: a different sequence
    assert h.sync([7, 9, 4]).tolist() == [7, 9, 4]  # the last held token changed: start over


def test_draft_length_follows_acceptance_and_costs():
    from engine.spec.proposers import AdaptiveLength

    policy = AdaptiveLength(start=4, max_k=8, probe=3)
    assert policy.get(1) == 4  # nothing known yet
    policy.observe(1, 0.010)  # a plain step: 10 ms
    for T in range(2, 10):
        policy.observe(T, 0.010 + 0.001 * (T - 1))  # cheap verification: +10% per position
    for _ in range(5):
        policy.update(1, 4, 4)  # everything accepted: draft long
    assert policy.get(1) == 8
    for _ in range(8):
        policy.update(1, 4, 0)  # nothing accepted: stop drafting...
    assert policy.get(1) == 0
    for _ in range(3):
        policy.update(1, 0, 0)  # ...but probe again after `probe` plain steps
    assert policy.get(1) == 1
    # expensive verification (each position costs a whole step): even good drafts do not pay
    costly = AdaptiveLength(start=4, max_k=8)
    for T in range(1, 10):
        costly.observe(T, 0.010 * T)
    costly.update(2, 4, 3)
    assert costly.get(2) == 0
    # a proposer as slow as a decode step (self-draft on a CPU): not worth it at 60%
    slow = AdaptiveLength(start=4, max_k=8)
    slow.observe(1, 0.010)
    slow.observe_proposer(4, 0.040)
    slow.update(3, 4, 2)
    assert slow.get(3) == 0
    # verification run eagerly against graph-captured plain steps (a GPU): 5 positions cost
    # 5 steps, so even a fully accepted draft cannot pay: no probes either
    eager = AdaptiveLength(start=4, max_k=8, probe=2)
    eager.observe(1, 0.020)
    eager.observe(5, 0.100)
    eager.update(5, 4, 1)
    for _ in range(4):
        eager.update(5, 0, 0)
    assert eager.get(5) == 0
    fixed = AdaptiveLength(start=3, max_k=8, fixed=True)
    fixed.update(4, 3, 0)
    assert fixed.get(4) == 3


def test_draft_length_prices_verifications_without_a_timed_plain_step():
    """A run that drafts at every step never times a plain step, the policy's unit of cost:
    it is then extrapolated from the verifications' times (about affine in the positions).
    With the CPU's measured costs (2 positions ~65 ms, 5 ~130 ms; a plain step ~45 ms) and
    half the drafts accepted, drafting does not pay; with flat costs it does."""
    from engine.spec.proposers import AdaptiveLength

    cpu = AdaptiveLength(start=4, max_k=8)
    cpu.observe(5, 0.130)
    cpu.update(1, 4, 2)
    assert cpu.get(1) > 0  # one length timed: no unit yet, the default pricing drafts
    cpu.observe(2, 0.065)
    assert abs(cpu._base() - 0.0433) < 0.001
    assert cpu.get(1) == 0  # 1.5 tokens for 1.5 steps at best: a plain step instead
    flat = AdaptiveLength(start=4, max_k=8)
    flat.observe(5, 0.053)
    flat.observe(2, 0.047)
    flat.update(1, 4, 2)
    assert flat.get(1) > 0
    timed = AdaptiveLength(start=4, max_k=8)  # a timed plain step wins over the estimate
    timed.observe(1, 0.020)
    timed.observe(2, 0.065)
    timed.observe(5, 0.130)
    assert timed._base() == 0.020
