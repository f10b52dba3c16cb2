"""Weight-only 4-bit linear layers on the GPU (W4A16): y = x @ W.T with W read as 4-bit
groups, W[n, k] = q[n, k] * scale[n, k // 32] + zero[n, k // 32], q in 0..15.

Decode at batch 1 is weight-bound: a bf16 weight costs 16 bits a weight per token, these
groups 4 + 32 / 32 (a bf16 scale and zero per 32 weights) = 5. So a GEMV that streams the
packed bytes at the copy bandwidth reads an 8B model's linears in ~0.3x the bf16 time.

Layout: `packed` uint8 [N, K // 2], byte j of row n holding q[n, 2j] in its low nibble and
q[n, 2j + 1] in its high one (`pack_int4`); `scale`, `zero` [N, K // 32] in the activation
dtype. GGUF's Q4_0/Q4_1/Q4_K blocks map onto it exactly (engine.loading.gguf_quants), and
any float weight through the least-squares fit of engine.loading.int4_groups.

The kernel: each program takes BLOCK_N output rows and a 1/SPLIT_K share of K, unpacks
BLOCK_K weights a row at a time, dequantizes them in fp32, rounds them to x's dtype and
multiplies by up to 16 rows of x (tl.dot, the rows padded to 16, fp32 accumulation); partial sums of the K shares go to an fp32 workspace,
summed after. More than 16 rows of x (a prefill chunk): the weight is dequantized once per
call into a bf16 temporary and multiplied by F.linear (compute-bound there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import HAS_TRITON

GROUP = 32
MAX_ROWS = 16  # rows of x one launch multiplies (tl.dot's smallest M)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _w4a16_kernel(
        X, PACKED, SCALE, ZERO, OUT, T, N, K, K_SHARE,
        stride_x, stride_p, stride_s, stride_os, stride_ot,
        BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        ts = tl.arange(0, BLOCK_T)
        t_ok = ts < T
        half = tl.arange(0, BLOCK_K // 2)
        groups = tl.arange(0, BLOCK_K // 32)
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        k_lo = split * K_SHARE
        for k0 in range(k_lo, k_lo + K_SHARE, BLOCK_K):
            # the packed bytes of BLOCK_K weights of each row: [BLOCK_N, BLOCK_K // 2]
            b = tl.load(
                PACKED + rows[:, None] * stride_p + (k0 // 2 + half)[None, :],
                mask=row_ok[:, None], other=0,
            ).to(tl.int32)  # fmt: skip
            q = tl.join(b & 15, b >> 4)  # [BLOCK_N, BLOCK_K // 2, 2]: k = 2j, 2j + 1
            q = tl.reshape(q, (BLOCK_N, BLOCK_K // 32, 32)).to(tl.float32)
            g = k0 // 32 + groups
            s = tl.load(SCALE + rows[:, None] * stride_s + g[None, :], mask=row_ok[:, None],
                        other=0.0).to(tl.float32)  # fmt: skip
            z = tl.load(ZERO + rows[:, None] * stride_s + g[None, :], mask=row_ok[:, None],
                        other=0.0).to(tl.float32)  # fmt: skip
            w = tl.reshape(q * s[:, :, None] + z[:, :, None], (BLOCK_N, BLOCK_K))
            ks = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(X + ts[:, None] * stride_x + ks[None, :], mask=t_ok[:, None], other=0.0)
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))  # fp32 accumulation
        tl.store(
            OUT + split * stride_os + ts[:, None] * stride_ot + rows[None, :],
            acc, mask=t_ok[:, None] & row_ok[None, :],
        )  # fmt: skip


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] in 0..15 (K even) -> uint8 [N, K // 2], two weights a byte."""
    q = q.to(torch.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4: uint8 [N, K // 2] -> uint8 [N, K]."""
    lo, hi = packed & 15, packed >> 4
    return torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:  # fmt: skip
    """The weight [N, K] the groups stand for, computed in fp32, returned in `dtype`."""
    q = unpack_int4(packed).float()
    n, k = q.shape
    w = q.view(n, k // GROUP, GROUP) * scale.float()[:, :, None] + zero.float()[:, :, None]
    return w.view(n, k).to(dtype)


def w4a16_reference(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                    zero: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """x [T, K] -> [T, N] in x's dtype: the dequantized weight times x, in fp32."""
    return (x.float() @ dequantize(packed, scale, zero).T).to(x.dtype)


def _blocks(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, SPLIT_K) for a weight [N, K]: enough programs to fill an H200's
    132 SMs a few times over, each streaming a long run of K."""
    block_k = 128 if k % 128 == 0 else (64 if k % 64 == 0 else 32)
    block_n = 32
    programs = triton.cdiv(n, block_n)
    split = 1
    while programs * split < 4 * 132 and k // (block_k * split * 2) >= 4 and \
            k % (block_k * split * 2) == 0:  # fmt: skip
        split *= 2
    return block_n, block_k, split


def w4a16(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
          use_triton: bool | None = None) -> torch.Tensor:  # fmt: skip
    """x [T, K] (contiguous rows) -> x @ W.T [T, N] in x's dtype."""
    T, K = x.shape
    N = packed.shape[0]
    if packed.shape[1] * 2 != K or K % GROUP or scale.shape != (N, K // GROUP):
        raise ValueError(f"w4a16: x {tuple(x.shape)} against packed {tuple(packed.shape)} "
                         f"and scales {tuple(scale.shape)}")  # fmt: skip
    triton_ok = HAS_TRITON and (use_triton if use_triton is not None else x.is_cuda)
    if not triton_ok:
        return w4a16_reference(x, packed, scale, zero)
    if T > MAX_ROWS:  # a prefill chunk: dequantize once, then a dense matmul
        return F.linear(x, dequantize(packed, scale, zero, x.dtype))
    x = x.contiguous()
    block_n, block_k, split = _blocks(N, K)
    out = torch.empty(split, T, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(N, block_n), split)
    _w4a16_kernel[grid](
        x, packed, scale, zero, out, T, N, K, K // split,
        x.stride(0), packed.stride(0), scale.stride(0), out.stride(0), out.stride(1),
        BLOCK_T=MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return (out[0] if split == 1 else out.sum(0)).to(x.dtype)
