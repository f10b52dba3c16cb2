"""SwiGLU activation: silu(gate) * up, from the fused gate_up projection [T, 2I].

Rounded like the eager model: silu in fp32, rounded to the activation dtype, then the product."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _silu_mul_kernel(GU, OUT, stride_gu, stride_o, INTER, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < INTER
        g = tl.load(GU + row * stride_gu + cols, mask=mask, other=0.0)
        u = tl.load(GU + row * stride_gu + INTER + cols, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
        tl.store(
            OUT + row * stride_o + cols,
            (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype),
            mask=mask,
        )


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: torch.Tensor, use_triton: bool | None = None) -> torch.Tensor:
    if (
        not (HAS_TRITON and (use_triton if use_triton is not None else gate_up.is_cuda))
        or gate_up.dim() != 2
    ):
        return silu_mul_reference(gate_up)
    T, two_i = gate_up.shape
    assert two_i % 2 == 0 and gate_up.stride(-1) == 1
    inter = two_i // 2
    out = torch.empty(T, inter, device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    _silu_mul_kernel[(T, triton.cdiv(inter, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block
    )
    return out
