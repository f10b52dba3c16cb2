"""Acceptance rules for speculative decoding.

Greedy: a draft token is accepted while it equals the target's argmax at its position; the
first mismatch is replaced by the target's argmax, and if every draft token is accepted the
target's argmax after the last one is appended (the "bonus" token). The output is therefore
token for token what greedy decoding of the target alone gives.

Sampling (Leviathan et al. 2023; Chen et al. 2023): for draft token x_i drawn from the draft
distribution q_i, accept with probability min(1, p_i(x_i) / q_i(x_i)), p_i the target's
distribution at that position. On the first rejection, emit a token drawn from the residual
distribution norm(max(0, p_i - q_i)) and stop. If all k are accepted, emit a token drawn from
p_{k+1}. Why the output is distributed as p_i: the probability of emitting token y at step i
is q(y) min(1, p(y)/q(y)) [drafted and accepted] + (1 - sum_x q(x) min(1, p(x)/q(x)))
* norm(max(0, p - q))(y) [rejected, then resampled]. The first term is min(q(y), p(y)). The
rejection mass is 1 - sum_x min(p(x), q(x)) = sum_x max(0, p(x) - q(x)), which is exactly the
normaliser of the residual, so the second term is max(0, p(y) - q(y)). Their sum is
min(q, p) + max(0, p - q) = p(y).
"""

from __future__ import annotations

import torch


def accept_greedy(target_argmax: list[int], draft: list[int]) -> list[int]:
    """target_argmax: the target's argmax at each of the k+1 verified positions (after the
    context, after draft[0], ..., after draft[k-1]); draft: k tokens. Returns the emitted
    tokens: the accepted prefix of the draft, then the target's token (1 to k+1 tokens)."""
    assert len(target_argmax) == len(draft) + 1
    out = []
    for i, token in enumerate(draft):
        if token != target_argmax[i]:
            break
        out.append(token)
    out.append(target_argmax[len(out)])
    return out


def accept_sampling(
    p_target: torch.Tensor,
    q_draft: torch.Tensor,
    draft: list[int],
    generator: torch.Generator | None = None,
) -> list[int]:
    """p_target [k+1, V] and q_draft [k, V]: probabilities (rows sum to 1) of the target and
    of the proposer at the k+1 / k positions; draft: the k tokens drawn from q_draft. A
    proposer without a distribution (prompt lookup) passes one-hot rows. Returns the emitted
    tokens (1 to k+1), distributed as sampling the target one token at a time."""
    k = len(draft)
    assert p_target.shape[0] == k + 1 and q_draft.shape[0] == k
    out = []
    for i, x in enumerate(draft):
        p, q = float(p_target[i, x]), float(q_draft[i, x])
        u = float(torch.rand((), generator=generator))
        if q > 0 and u < min(1.0, p / q):
            out.append(x)
            continue
        residual = (p_target[i] - q_draft[i]).clamp(min=0)
        total = float(residual.sum())
        dist = residual / total if total > 0 else p_target[i]
        out.append(int(torch.multinomial(dist, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p_target[k], 1, generator=generator)))
    return out
