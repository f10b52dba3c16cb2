"""Token sampling: greedy, temperature, top-k, top-p, seeded.

Sampling uses the exponential trick (argmax of p / E with E ~ Exp(1)), which draws from p
without `multinomial` and its host synchronisation.
"""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits: [V] float32 -> logits with the excluded tokens at -inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p
        drop = (probs.cumsum(-1) - probs) >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def penalize(row: torch.Tensor, token_ids: list[int], penalty: float) -> torch.Tensor:
    """Repetition penalty over the distinct tokens already generated."""
    if penalty == 1.0 or not token_ids:
        return row
    idx = torch.tensor(sorted(set(token_ids)), device=row.device)
    picked = row[idx]
    row = row.clone()
    row[idx] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return row


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    generated: list[list[int]] | None = None,
) -> list[int]:
    """logits: [B, V] -> one token id per row. generated: each row's tokens so far (for the
    repetition penalty)."""
    greedy = logits.argmax(dim=-1)
    out: list[int] = greedy.tolist()
    for i, p in enumerate(params):
        if p.plain_greedy:
            continue
        row = penalize(logits[i].float(), generated[i] if generated else [], p.repetition_penalty)
        if p.greedy:
            out[i] = int(row.argmax())
            continue
        row = filter_logits(row / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(row, dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=generators[i])
        out[i] = int((probs / noise).argmax())
    return out
