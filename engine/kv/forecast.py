"""Forecast: layer l predicts the pages that layer l+1 will select, so that those missing on
the GPU are fetched while layer l's MLP and layer l+1's projections run (after SparDA's
Forecast; see ../shared/DESIGN.md).

The predictor reads the residual stream in the middle of layer l: after its attention, before
its MLP. (Layer l's output itself is layer l+1's input, from which layer l+1's exact query
follows at once: predicting from it would leave only layer l+1's own projections to hide a
fetch behind. Reading before the MLP leaves the MLP too, the larger part of a layer.)

Training-free variant: F_l(r) = RoPE(q_proj_{l+1}(RMSNorm_{l+1}(r))): layer l+1's own norm,
query projection (and q-norm where the model has one) and RoPE at the current position,
applied to what the residual stream holds before layer l's MLP adds to it. Its queries are
pooled per GQA group and scored against layer l+1's page summaries exactly as the exact
selector scores them (plain dot products, no softmax), then the same top-k picks the pages.

The prediction only decides what is fetched early; the attention of layer l+1 always uses
its exact selection (pages the prediction missed are fetched on demand), so prefetching
changes speed, never results.
"""

from __future__ import annotations

import torch

from engine.step_context import StepContext


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate-half layout) of x [T, H, D] with cos/sin [T, D]."""
    half = x.shape[-1] // 2
    rolled = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rolled * sin[:, None]


class TrainingFreeForecast:
    """Layer l+1's query, predicted from the residual stream before layer l's MLP."""

    name = "free"

    def __init__(self, model) -> None:
        self.layers = model.layers

    def query(self, next_layer: int, residual: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """residual [T, hidden] (layer next_layer - 1, before its MLP) -> [T, Hq, D]."""
        layer = self.layers[next_layer]
        attn = layer.self_attn
        h = layer.input_layernorm.forward(residual)
        q = attn.qkv_proj.forward(h)[:, : attn.q_size]
        q = q.reshape(q.shape[0], attn.num_heads, attn.head_dim)
        if attn.qk_norm:
            q = attn.q_norm(q)
        return rotate(q, ctx.cos, ctx.sin)
