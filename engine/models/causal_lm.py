"""The Llama-family decoder in plain torch: Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2.

One implementation with switches (qkv bias, q/k norm, tied embeddings). Activations are
flattened over the batch: x is [T, hidden] where T counts the tokens of every sequence in
the step; the StepContext says which tokens belong to which sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.layers.attention import paged_attention
from engine.layers.step_context import StepContext
from kernels.rmsnorm import rmsnorm
from kernels.rope_kv import apply_rope, rope_kv
from kernels.silu_mul import silu_mul
from kernels.views import RowPlaces


def gelu_mul(gate_up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate=approximate) * up


# act(gate) * up for each hidden_act the config may name (engine.models.hf_config.ACTIVATIONS), as
# transformers' ACT2FN computes it: gelu_new is the tanh approximation written out
ACT_MUL = {
    "silu": silu_mul,
    "swish": silu_mul,
    "gelu": gelu_mul,
    "gelu_pytorch_tanh": lambda gate_up: gelu_mul(gate_up, "tanh"),
    "gelu_new": lambda gate_up: gelu_mul(gate_up, "tanh"),
}


def row_exact(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """linear(x) with each row computed as a one-row call would: a GEMM over several rows
    may sum in another order than the GEMV of one row (MKL does, in the last bits), so a
    verification step runs its rows one by one. The quantized kernels are row-independent as
    they are (tested; the W4A16 kernel up to its 16 rows a launch, in the interpreter: on a
    GPU, where no verification is bit-exact, each row block compiles its own kernel), and
    are kept for any row count here (their dense switch-over would change the numbers)."""
    from engine.loading.gpu_int4 import W4A16Linear
    from engine.loading.quant import QUANT_LINEARS

    if isinstance(linear, (*QUANT_LINEARS, W4A16Linear)):
        return linear.forward(x, kernel_rows=x.shape[0])
    return torch.cat([linear.forward(x[i : i + 1]) for i in range(x.shape[0])])


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without residual: the norm of x. With it: (norm of x + residual, x + residual)."""
        return rmsnorm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # q, k and v in one matmul: fewer launches per layer
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.head_dim**-0.5
        # the attention over the paged cache (prefill, and dense decode); a benchmark may
        # put another in its place (bench.scorers: prefill without attention)
        self.paged_attention = paged_attention

    def rotated_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [T, Hq, D], k and v [T, Hkv, D] of x [T, hidden], q and k rotated, written
        nowhere (for passes outside the paged cache: draft rings, Forecast training)."""
        T = x.shape[0]
        q, k, v = self.qkv_proj.forward(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, kv: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        T = x.shape[0]
        exact = ctx.verify and not x.is_cuda
        qkv = row_exact(self.qkv_proj, x) if exact else self.qkv_proj.forward(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.view(T, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        # rotate q and k, and append k and v to the paged cache
        q, k = rope_kv(q, k, v, ctx.cos, ctx.sin, kv, RowPlaces(ctx.slot_pages, ctx.slot_offsets))
        if ctx.tiers is not None:
            # a decode step (one row per sequence, each in its own last page) or not
            distinct = ctx.tier_tables is not None and ctx.tier_tables.shape[0] == T
            ctx.tiers.after_append(self.layer_idx, k, v, ctx.slot_pages, ctx.slot_offsets,
                                   distinct)  # fmt: skip
            if ctx.tier_tables is not None:  # a decode step: sparse over the tiers
                B = ctx.tier_tables.shape[0]
                o = ctx.tiers.attend(
                    self.layer_idx, q.view(B, T // B, *q.shape[1:]), ctx.tier_tables,
                    ctx.tier_lens, self.scale,
                )  # fmt: skip
                o = o.reshape(T, self.q_size)
                return row_exact(self.o_proj, o) if exact else self.o_proj.forward(o)
        o = self.paged_attention(q, k, v, kv, ctx, self.scale, self.layer_idx)
        o = o.reshape(T, self.q_size)
        return row_exact(self.o_proj, o) if exact else self.o_proj.forward(o)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        bias = cfg.mlp_bias
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        self.act_mul = ACT_MUL[cfg.hidden_act]

    def forward(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        if exact:
            return row_exact(self.down_proj, self.act_mul(row_exact(self.gate_up_proj, x)))
        return self.down_proj.forward(self.act_mul(self.gate_up_proj.forward(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, kv: torch.Tensor, ctx: StepContext
    ):
        """Returns (this layer's MLP output, the residual stream before it); the next norm adds them."""
        if residual is None:
            h, residual = self.input_layernorm.forward(x), x
        else:
            h, residual = self.input_layernorm.forward(x, residual)
        h = self.self_attn.forward(h, kv, ctx)
        h, residual = self.post_attention_layernorm.forward(h, residual)
        if ctx.tier_tables is not None:  # sparse decode: Forecast prefetch for the next layer
            ctx.tiers.after_attention(self.self_attn.layer_idx, residual, ctx)
        return self.mlp.forward(h, ctx.verify and not h.is_cuda), residual


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.int8_head: nn.Module | None = None  # set by engine.loading.quant for fast CPU decode

    def forward(self, input_ids: torch.Tensor, kv_layers: list[torch.Tensor], ctx: StepContext):
        """input_ids: [T] -> final hidden states [T, hidden]."""
        x, residual = self.embed_tokens(input_ids), None
        # .forward directly: no hooks are used here, and nn.Module.__call__ costs a few us,
        # ~270 times per decode step, which shows on the CPU
        hook = ctx.layer_hook
        for i, (layer, kv) in enumerate(zip(self.layers, kv_layers, strict=True)):
            x, residual = layer.forward(x, residual, kv, ctx)
            if hook is not None:
                hook(i)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """exact: each row as a one-row call computes it (a verification on the CPU)."""
        if self.int8_head is not None:
            return self.int8_head(hidden)  # row-independent (tested)
        weight = self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight
        if exact and not hidden.is_cuda:
            return torch.cat([F.linear(hidden[i : i + 1], weight) for i in range(len(hidden))])
        return F.linear(hidden, weight)
