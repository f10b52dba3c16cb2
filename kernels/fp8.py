"""fp8 KV rows (EngineConfig.kv_dtype = "fp8"): float8 e4m3 (finite-only, the largest value
448), scale 1, values beyond +-448 saturated, rounded to nearest even.

Kernels that write fp8 rows store the bits through a uint8 view of the pool, computed by
`_fp8_bits` in integer and float arithmetic: the Triton interpreter's own fp32 -> fp8
conversion rounds ~2% of values wrongly (it drops the mantissa's carry into the exponent),
so the conversion the CPU tests run is the one the GPU runs, and both equal `to_fp8`.
Kernels that read fp8 rows load them as they are and convert to the query's dtype.
"""

from __future__ import annotations

import torch

from kernels import HAS_TRITON

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
FP8_MAX_BITS = 0x7E  # 448's bits (| 0x80: -448)


def to_fp8(x: torch.Tensor) -> torch.Tensor:
    """x rounded to fp8 e4m3, saturated at +-448 (whatever the torch version's cast does
    past them)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8)


def to_kv(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as a KV pool of `dtype` stores it (saturated where fp8)."""
    return to_fp8(x) if dtype == FP8 else x.to(dtype)


def kv_store_view(pool: torch.Tensor) -> torch.Tensor:
    """The tensor a kernel writes the pool through: uint8 bits for fp8, else the pool."""
    return pool.view(torch.uint8) if pool.dtype == FP8 else pool


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _fp8_bits(x):
        """fp8 e4m3 bits (uint8) of x (any float dtype), rounded to nearest even and
        saturated at +-448."""
        x = tl.minimum(tl.maximum(x.to(tl.float32), -448.0), 448.0)
        a = tl.abs(x)
        sign = (x.to(tl.int32, bitcast=True) >> 24) & 128
        # normal (a >= 2^-6): the fp32 mantissa rounded to 3 bits, nearest even
        b = a.to(tl.int32, bitcast=True)
        b = (b + 0x7FFFF + ((b >> 20) & 1)) & ~0xFFFFF
        normal = (((b >> 23) - 120) << 3) | ((b >> 20) & 7)
        # subnormal (a < 2^-6): multiples of 2^-9, nearest even (8: the smallest normal)
        y = a * 512.0
        f = tl.floor(y)
        r = y - f
        fi = f.to(tl.int32)
        up = (r > 0.5) | ((r == 0.5) & ((fi & 1) == 1))
        sub = fi + up.to(tl.int32)
        bits = tl.where(a < 0.015625, sub, normal)
        return (bits | sign).to(tl.uint8)

    @triton.jit
    def _fp8_cast(X, OUT, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(OUT + i, _fp8_bits(tl.load(X + i, mask=m, other=0.0)), mask=m)


def fp8_bits_triton(x: torch.Tensor) -> torch.Tensor:
    """to_fp8(x) by the kernels' conversion, as fp8 (tests)."""
    out = torch.empty(x.numel(), dtype=torch.uint8, device=x.device)
    _fp8_cast[(triton.cdiv(x.numel(), 1024),)](x.contiguous().view(-1), out, x.numel(),
                                                       BLOCK=1024)  # fmt: skip
    return out.view(FP8).view(x.shape)
