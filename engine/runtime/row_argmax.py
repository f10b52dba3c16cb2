"""The argmax of each row of a decode step's logits, in two passes.

torch's argmax over one long row ([1, 128256]) runs as one reduction kernel whose single
output leaves most of the GPU idle: 35 us on the H200 in a CUDA-graph decode step, 0.7% of
an 8B model's step at 4K. Reducing chunks of the row first, then the chunks' maxima, spreads
the first pass over the whole row; the result is torch.argmax's, the first index of the
largest value (NaN counting as the largest), since each pass keeps the first of equals.
"""

from __future__ import annotations

import torch

CHUNK = 1024  # values a first-pass row reduces


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """argmax(dim=-1) of a [B, V] tensor, as int64 [B]."""
    B, V = logits.shape
    full = V // CHUNK * CHUNK
    if full < 2 * CHUNK:  # a short row gains nothing from two passes
        return logits.argmax(dim=-1)
    values, index = logits[:, :full].reshape(B, full // CHUNK, CHUNK).max(dim=-1)
    index = index + torch.arange(0, full, CHUNK, device=logits.device)
    if full < V:  # the tail after the last whole chunk, taken as one more chunk
        tail_value, tail_index = logits[:, full:].max(dim=-1)
        values = torch.cat([values, tail_value[:, None]], dim=1)
        index = torch.cat([index, (tail_index + full)[:, None]], dim=1)
    best = values.argmax(dim=-1)
    return index.gather(1, best[:, None]).squeeze(1)
