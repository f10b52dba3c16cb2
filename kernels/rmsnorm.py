"""RMSNorm, optionally fused with the residual add before it.

    residual' = x + residual          (rounded to the activation dtype, as the eager model does)
    out       = weight * (residual' / rms(residual')).to(dtype)

One program per row; the eager version is ~6 kernels per norm, which at batch 1 decode
costs more in launches than in bytes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rmsnorm_kernel(
        X, R, W, OUT, R_OUT, stride_x, stride_r, stride_o, stride_ro, N, eps,
        HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(r.dtype)
            tl.store(R_OUT + row * stride_ro + cols, x, mask=mask)
        xf = x.to(tl.float32)
        var = tl.sum(xf * xf, axis=0) / N
        normed = (xf * tl.rsqrt(var + eps)).to(x.dtype)
        w = tl.load(W + cols, mask=mask, other=0.0)
        out = (w.to(tl.float32) * normed.to(tl.float32)).to(OUT.dtype.element_ty)
        tl.store(OUT + row * stride_o + cols, out, mask=mask)


def rmsnorm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """Returns out, or (out, new_residual) when residual is given."""
    if residual is not None:
        x = x + residual
    if x.dtype == weight.dtype == torch.float32:  # one fused op on the CPU, same fp32 math
        out = F.rms_norm(x, (x.shape[-1],), weight, eps)
        return out if residual is None else (out, x)
    xf = x.float()
    out = weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return out if residual is None else (out, x)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    use_triton: bool | None = None,
):
    """x, residual: [T, N]; weight: [N]. Same results as rmsnorm_reference. use_triton: None
    picks Triton on CUDA tensors; True forces it (the tests, under TRITON_INTERPRET=1)."""
    if not (HAS_TRITON and (use_triton if use_triton is not None else x.is_cuda)) or x.dim() != 2:
        return rmsnorm_reference(x, weight, eps, residual)
    T, N = x.shape
    assert weight.shape == (N,) and x.stride(-1) == 1
    out = torch.empty(T, N, device=x.device, dtype=torch.promote_types(x.dtype, weight.dtype))
    new_res = torch.empty_like(x) if residual is not None else x
    r = residual if residual is not None else x
    _rmsnorm_kernel[(T,)](
        x, r, weight, out, new_res,
        x.stride(0), r.stride(0), out.stride(0), new_res.stride(0), N, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(N),
    )  # fmt: skip
    return out if residual is None else (out, new_res)
