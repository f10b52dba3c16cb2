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

from engine.layers.step_context import StepContext
from kernels.rope_kv import apply_rope


class TrainingFreeForecast:
    """Layer l+1's query, predicted from the residual stream before layer l's MLP."""

    name = "free"

    def __init__(self, model) -> None:
        self.layers = model.layers

    def query(self, next_layer: int, residual: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """residual [T, hidden] (layer next_layer - 1, before its MLP) -> [T, Hq, D]."""
        n = self.normed(next_layer, residual)
        return self.query_from(next_layer, n, ctx.cos, ctx.sin)

    def normed(self, next_layer: int, residual: torch.Tensor) -> torch.Tensor:
        """The predictor's input: layer next_layer's input norm of the residual stream."""
        return self.layers[next_layer].input_layernorm.forward(residual)

    def query_from(self, next_layer: int, n: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Layer next_layer's query projection (and q-norm) of n, rotated: [T, Hq, D]."""
        attn = self.layers[next_layer].self_attn
        q = attn.qkv_proj.forward(n)[:, : attn.q_size]
        q = q.reshape(q.shape[0], attn.num_heads, attn.head_dim)
        if attn.qk_norm:
            q = attn.q_norm(q)
        return apply_rope(q, cos, sin)


def low_rank_correction(n: torch.Tensor, a: torch.Tensor, b: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, shape) -> torch.Tensor:  # fmt: skip
    """The trained part of a Forecast query: RoPE(B A n), fp32, viewed as `shape`."""
    return apply_rope(((n.float() @ a.T) @ b.T).view(shape), cos.float(), sin.float())


class TrainedForecast(TrainingFreeForecast):
    """The training-free query plus a trained low-rank correction per predicted layer:
    F_l(r) = RoPE(q_proj_{l+1}(n) + B_l A_l n), n = RMSNorm_{l+1}(r), A_l [rank, hidden],
    B_l [Hq * D, rank]. B starts at zero, so training starts from the training-free
    predictor. Trained by engine.kv.forecast_train; stored in a small safetensors file keyed
    to the model (`model_key`)."""

    name = "trained"

    def __init__(self, model, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__(model)
        p = next(model.parameters())
        self.weights = {
            layer: (a.to(p.device, torch.float32), b.to(p.device, torch.float32))
            for layer, (a, b) in weights.items()
        }

    def query(self, next_layer: int, residual: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        n = self.normed(next_layer, residual)
        q = self.query_from(next_layer, n, ctx.cos, ctx.sin)
        ab = self.weights.get(next_layer)
        if ab is None:
            return q
        return q + low_rank_correction(n, *ab, ctx.cos, ctx.sin, q.shape).to(q.dtype)


FORMAT = "agentctx-forecast-1"


def model_key(model) -> str:
    """What a Forecast weights file is keyed to: the model's shape and a sample of its
    embedding table, rounded (the same model loaded in fp32, bf16 or int4 modes keeps its
    embeddings, to bf16 precision, so one file serves every mode)."""
    import hashlib

    emb = model.embed_tokens.weight.detach().reshape(-1)
    idx = torch.arange(1024, device=emb.device) * (emb.numel() - 1) // 1023
    sample = emb[idx].float().to(torch.bfloat16).float().cpu().numpy().tobytes()
    cfg = model.cfg
    shape = (f"{cfg.vocab_size}:{cfg.hidden_size}:{cfg.num_layers}:{cfg.num_heads}:"
             f"{cfg.num_kv_heads}:{cfg.head_dim}")  # fmt: skip
    return hashlib.blake2b(shape.encode() + sample, digest_size=16).hexdigest()


def save_weights(path, model, weights: dict[int, tuple[torch.Tensor, torch.Tensor]],
                 meta: dict[str, str] | None = None) -> None:  # fmt: skip
    from safetensors.torch import save_file

    tensors = {}
    for layer, (a, b) in weights.items():
        tensors[f"layers.{layer}.A"] = a.detach().to(torch.float16).contiguous().cpu()
        tensors[f"layers.{layer}.B"] = b.detach().to(torch.float16).contiguous().cpu()
    save_file(tensors, str(path), metadata={"format": FORMAT, "model_key": model_key(model),
                                            **(meta or {})})  # fmt: skip


def load_forecast(model, path) -> TrainingFreeForecast:
    """The trained predictor from `path`, or, with a warning, the training-free one when the
    file is missing, damaged, or made for another model."""
    import warnings

    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"not a Forecast weights file (format {meta.get('format')!r})")
            if meta.get("model_key") != model_key(model):
                raise ValueError("made for another model")
            weights: dict[int, list] = {}
            for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                _, layer, which = name.split(".")
                weights.setdefault(int(layer), [None, None])["AB".index(which)] = f.get_tensor(name)
        cfg = model.cfg
        for layer, (a, b) in weights.items():
            if not (0 < layer < cfg.num_layers) or a is None or b is None:
                raise ValueError(f"layer {layer} is incomplete or out of range")
            if a.shape[1] != cfg.hidden_size or b.shape != (cfg.num_heads * cfg.head_dim,
                                                           a.shape[0]):  # fmt: skip
                raise ValueError(f"layer {layer} has shapes {tuple(a.shape)}, {tuple(b.shape)}")
        return TrainedForecast(model, {k: (a, b) for k, (a, b) in weights.items()})
    except Exception as e:  # noqa: BLE001 - any unreadable file means: fall back
        warnings.warn(
            f"Forecast weights {path}: {e}; using the training-free predictor",
            RuntimeWarning,
            stacklevel=2,
        )
        return TrainingFreeForecast(model)


def default_weights_path(model):
    """The Forecast weights shipped for this model, if any (keyed by model_key)."""
    from pathlib import Path

    path = Path(__file__).parent / "forecast_weights" / f"{model_key(model)}.safetensors"
    return path if path.exists() else None
