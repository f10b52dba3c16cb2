"""4-bit weights on a GPU: every layer's linears as W4A16Linear (kernels.w4a16), decode
reading 5 bits a weight instead of bf16's 16. Engine.load's weights="int4" / "int4-all" on a
GPU: a GGUF's own 4-bit blocks where it has them, the rest (Q5_0, Q6_K, Q8_0, F16...) fitted
to 4-bit groups (engine.loading.int4_groups), as the CPU's int4-all mode does; random
("dummy:PRESET") or full-precision weights are fitted the same way, on the GPU. The
embedding and the output head stay in the model's dtype."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

from kernels.w4a16 import pack_int4, w4a16


class W4A16Linear(nn.Module):
    """y = x @ W.T + bias with W[n, k] = q * scale + zero per group of 32 along k."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                 bias: torch.Tensor | None, dtype: torch.dtype) -> None:  # fmt: skip
        super().__init__()
        n, k = q.shape
        if k % 32 or scale.shape != (n, k // 32) or zero.shape != scale.shape:
            raise ValueError(f"bad 4-bit weight: q {tuple(q.shape)}, scale {tuple(scale.shape)}")
        self.in_features, self.out_features, self.dtype = k, n, dtype
        self.packed: torch.Tensor
        self.register_buffer("packed", pack_int4(q))
        self.scale: torch.Tensor
        self.register_buffer("scale", scale.to(dtype).contiguous())
        self.zero: torch.Tensor
        self.register_buffer("zero", zero.to(dtype).contiguous())
        self.bias: torch.Tensor | None
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    def forward(self, x: torch.Tensor, kernel_rows: int = 0) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(self.dtype)
        y = w4a16(x2, self.packed, self.scale, self.zero)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, 4-bit groups"


def load_gpu_int4(model: nn.Module, directory: Path | None) -> int:
    """Replace each layer's qkv_proj, o_proj, gate_up_proj and down_proj by a W4A16Linear:
    the 4-bit arrays of a converted GGUF in `directory` where every part has a quantized
    form, else (None, or a checkpoint without them) the weights themselves fitted to 4-bit
    groups. Returns how many modules it replaced."""
    from engine.loading.int4_groups import int4_groups
    from engine.loading.quant import _FUSED, _Arrays

    dtype = next(model.parameters()).dtype
    n = 0
    arrays = _Arrays(directory) if directory is not None else None
    with arrays if arrays is not None else nullcontext():
        for i, layer in enumerate(model.layers):
            for ours, hf_names in _FUSED.items():
                parent_name, _, attr = ours.partition(".")
                parent = getattr(layer, parent_name)
                old = getattr(parent, attr)
                weight = old.weight.detach()
                bases = [f"model.layers.{i}.{hf}" for hf in hf_names]
                kinds = [arrays.form(b) for b in bases] if arrays is not None else [None]
                if arrays is not None and None not in kinds:
                    # the stored blocks (other types fitted from the dense rows, on the CPU)
                    q, scale, zero = arrays.int4(bases, kinds, weight.cpu())
                    q, scale, zero = (t.to(weight.device) for t in (q, scale, zero))
                else:
                    q, scale, zero = int4_groups(weight)
                bias = None if old.bias is None else old.bias.detach()
                setattr(parent, attr, W4A16Linear(q, scale, zero, bias, dtype))
                del old, weight
                n += 1
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the dense weights' memory back
    return n
