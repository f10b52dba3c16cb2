"""4-bit linear layers for CPU decode, from the Q4_0/Q4_1 arrays engine.gguf_file keeps.

Decode on a small CPU is memory-bound: each token reads every weight once. torch's CPU
int4 kernel reads 4-bit weights (8x less than fp32) and computes in bf16. The 120 linears
of SmolLM2-135M (30 layers), 2 cores of a Sapphire Rapids, min of 4 runs, ms per forward:

    tokens T            1     4     8    12    16    32    48    64   512
    Int4Linear        6.8   9.9  15.7  21.7  27.4  48.2  69.6  89.9   690
    F.linear fp32    19.2  31.9  39.2  45.0  45.0  54.1  60.5  76.2   332
    F.linear bf16    20.6  21.2  22.1  22.0  22.1  24.6  29.6  32.8  93.1  (AMX)

The int4 kernel costs ~1.35 ms per token (no reuse of a weight across rows), so prefill
chunks (up to 512 tokens) run 2x slower than fp32 in it: Int4Linear can keep a dense weight
for inputs of more than max_tokens rows. End to end (Engine, 2048-token prefill, 512-token
chunks): fp32 model 2.9 s; int4 + dense fp32 2.9 s; int4 + dense bf16 1.9 s; int4 alone 4.4 s.
Decode of the whole model: 42 ms/token fp32, 25 ms/token int4.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from engine.model import CausalLM

GROUP_SIZE = 32  # GGUF Q4 block: one scale and zero per 32 weights along K
# Above these many tokens the dense weight wins (the table above, with some margin).
DENSE_ABOVE = {torch.float32: 32, torch.bfloat16: 8}
_FUSED = {  # our fused module -> its HF parts, in loader.py's row order
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}


class Int4Linear(nn.Module):
    """y = x @ W.T + bias with W[n, k] = q[n, k] * scale[n, k // 32] + zero[n, k // 32].

    Runs torch's CPU int4 kernel on bf16 activations (~1e-2 abs error on outputs of ~3);
    with `dense` (W in fp32 or bf16), inputs of more than `max_tokens` rows use F.linear."""

    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor,
        bias: torch.Tensor | None = None,
        dense: torch.Tensor | None = None,
        max_tokens: int | None = None,
    ):
        super().__init__()
        N, K = q.shape
        if K % GROUP_SIZE or scale.shape != (N, K // GROUP_SIZE) or zero.shape != scale.shape:
            raise ValueError(
                f"bad 4-bit weight: q {tuple(q.shape)}, scale {tuple(scale.shape)}, "
                f"zero {tuple(zero.shape)}; K must be a multiple of {GROUP_SIZE}"
            )
        if dense is not None and dense.shape != (N, K):
            raise ValueError(f"dense weight {tuple(dense.shape)} is not {(N, K)}")
        self.in_features, self.out_features = K, N
        # the kernel wants N % 16 == 0: pad with zero rows (scale 0, zero 0) and slice them off
        pad = -N % 16
        q, scale, zero = (F.pad(t, (0, 0, 0, pad)) for t in (q, scale.float(), zero.float()))
        self.packed: torch.Tensor
        self.register_buffer(
            "packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        )
        # The kernel computes (q - 8) * s + z: so s = scale, z = zero + 8 scale, as [K/32, N, 2].
        sz = torch.stack([scale, zero + 8 * scale], dim=-1).transpose(0, 1)
        self.scales_and_zeros: torch.Tensor
        self.register_buffer("scales_and_zeros", sz.to(torch.bfloat16).contiguous())
        self.bias: torch.Tensor | None
        self.register_buffer("bias", bias)
        self.dense: torch.Tensor | None
        self.register_buffer("dense", dense)
        if max_tokens is None:
            max_tokens = DENSE_ABOVE.get(dense.dtype, 32) if dense is not None else 0
        self.max_tokens = max_tokens

    def forward(self, x: torch.Tensor, kernel_rows: int = 0) -> torch.Tensor:
        """kernel_rows: use the 4-bit kernel up to this many rows even past max_tokens (a
        verification step's rows must match single-row decode bit for bit)."""
        # Kept lean: at T = 1 the kernel takes ~15 us, so each extra op's ~1 us shows.
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        dense, bias = self.dense, self.bias
        if dense is not None and x2.shape[0] > max(self.max_tokens, kernel_rows):
            y = F.linear(x2.to(dense.dtype), dense, None if bias is None else bias.to(dense.dtype))
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2.to(torch.bfloat16).contiguous(), self.packed, GROUP_SIZE, self.scales_and_zeros
            )
            if y.shape[1] != self.out_features:
                y = y[:, : self.out_features]  # drop the padding rows
            if bias is not None:
                y = y + bias
        y = y.to(x.dtype)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        dense = "none" if self.dense is None else str(self.dense.dtype).removeprefix("torch.")
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, dense={dense} above {self.max_tokens} tokens"
        )


def load_native_int4(
    model: CausalLM, directory: Path, dense_dtype: torch.dtype | None = torch.float32
) -> int:
    """Replace every layer's qkv_proj, o_proj, gate_up_proj and down_proj with an Int4Linear
    built from directory / Q4_FILE (written by engine.gguf_file). Returns how many modules
    were replaced: 0, with the model unchanged, when there is no such file or some weight
    has no 4-bit form there.

    dense_dtype: keep each weight also densely in this dtype (the loaded fp32 one, or a bf16
    copy) for prefill chunks, where the int4 kernel is slower; None frees it (least memory).
    CPU only: ValueError for a model on another device."""
    from engine.gguf_file import Q4_FILE

    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"4-bit weights run on CPU only; the model is on {device}")
    if dense_dtype not in (None, torch.float32, torch.bfloat16):
        raise ValueError(f"dense_dtype must be None, float32 or bfloat16, not {dense_dtype}")
    path = Path(directory) / Q4_FILE
    if not path.is_file():
        return 0
    from safetensors import safe_open

    parts = ("q", "scale", "zero")
    plan = []  # (parent module, attribute, current nn.Linear, HF names of its row blocks)
    for i, layer in enumerate(model.layers):
        for ours, hf_names in _FUSED.items():
            parent_name, _, attr = ours.partition(".")
            parent = getattr(layer, parent_name)
            bases = [f"model.layers.{i}.{hf}" for hf in hf_names]
            plan.append((parent, attr, getattr(parent, attr), bases))
    with safe_open(str(path), framework="pt", device="cpu") as f:
        keys = set(f.keys())
        # All or nothing (the promise above); a file with some weights in other types, say
        # Q6_K, stays dense everywhere.
        if any(f"{b}.{p}" not in keys for *_, bases in plan for b in bases for p in parts):
            return 0
        for _, _, old, bases in plan:  # check every shape before changing anything
            rows = sum(f.get_slice(f"{b}.q").get_shape()[0] for b in bases)
            cols = {f.get_slice(f"{b}.q").get_shape()[1] for b in bases}
            if (rows, *cols) != tuple(old.weight.shape):
                raise ValueError(
                    f"{path}: {bases[0]}: 4-bit rows {rows} x {sorted(cols)} do not fit "
                    f"the model's {tuple(old.weight.shape)} weight"
                )
        for parent, attr, old, bases in plan:
            # fused rows in loader.py's order: q, k, v and gate, up
            q, scale, zero = (torch.cat([f.get_tensor(f"{b}.{p}") for b in bases]) for p in parts)
            dense = None if dense_dtype is None else old.weight.detach().to(dense_dtype)
            bias = None if old.bias is None else old.bias.detach()
            setattr(parent, attr, Int4Linear(q, scale, zero, bias, dense))
    return len(plan)


class Int8Head(nn.Module):
    """The output projection with per-row symmetric int8 weights, for CPU decode.

    SmolLM2's tied head is 49152 x 576: 113 MB of fp32 read per token, the largest single read
    once the layers are 4-bit. Per-row int8 with bf16 activations takes 2.5 ms against 6.2 ms
    in fp32 (cold cache, 2 cores); on 600 positions of a novel its top-1 token agrees with the
    fp32 head on 96.8% (a bf16 head: 97.3%; the disagreements are near-ties)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        scale = weight.detach().float().abs().amax(dim=1).clamp_min(1e-12) / 127
        self.register_buffer(
            "q", torch.round(weight.detach().float() / scale[:, None]).to(torch.int8)
        )
        self.register_buffer("scale", scale.to(torch.bfloat16))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.to(torch.bfloat16).contiguous()
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.scale).to(hidden.dtype)


def quantize_lm_head(model: CausalLM) -> None:
    """Give a CPU model an int8 output head (decode speed); the dense head stays for reference."""
    if model.embed_tokens.weight.device.type != "cpu":
        raise ValueError("the int8 head is a CPU kernel")
    weight = model.embed_tokens.weight if model.cfg.tie_word_embeddings else model.lm_head.weight
    model.int8_head = Int8Head(weight)
