"""Weight-only 4-bit linear layers on the GPU (W4A16): y = x @ W.T with W read as 4-bit
groups, W[n, k] = q[n, k] * scale[n, k // 32] + zero[n, k // 32], q in 0..15.

Decode at batch 1 is weight-bound: a bf16 weight costs 16 bits a weight per token, these
groups 4 + 32 / 32 (a bf16 scale and zero per 32 weights) = 5. So a GEMV that streams the
packed bytes at the copy bandwidth reads an 8B model's linears in ~0.3x the bf16 time.

Layout: `packed` uint8 [N, K // 2], byte j of row n holding q[n, 2j] in its low nibble and
q[n, 2j + 1] in its high one (`pack_int4`); `scale`, `zero` [N, K // 32] in the activation
dtype. GGUF's Q4_0/Q4_1/Q4_K blocks map onto it exactly (engine.loading.gguf_quants), and
any float weight through the least-squares fit of engine.loading.int4_groups.

The kernel: each program takes BLOCK_N output rows and a 1/SPLIT_K share of K, and per
group of 32 weights computes s * (q . x) + z * sum(x) in fp32 from the nibbles as they lie
(low nibbles meet x's even entries, high ones its odd entries: no interleaving, no tensor
cores, two FMAs a weight for each of up to 16 rows of x). With K in one share the kernel
stores x's dtype itself; split in shares, their fp32 partials go to a workspace that one
small kernel adds up in split order and casts (torch's sum, then a cast, were two kernels
more per linear, 3.8 us of an 8B k/v GEMV's 7.7 at one row on the H200). The blocks per
weight shape are timed once on a GPU (_config; K blocks of 512-1024 took an 8B step's GEMVs
from 2.61 to 2.44 ms in CUDA graphs on the H200), and then kept for every row count: a row
sums alike in a 1-row step and in a verification's rows. (Variants that lost to this one on
the H200: dequantizing weight by weight, one reduction a block and no reshapes, at every 8B
shape; the weights read as int32 words with the nibbles turned to floats by a bit trick,
~1.4 TB/s at best, as this kernel: its compiled loop takes 5-7 instructions a weight, which
bound it, not memory.) More than 16 rows of x (a prefill chunk): the weight is dequantized
once per call into a bf16 temporary and multiplied by F.linear (compute-bound there).

A second kernel, "words" (timed by bench.w4a16_speed, not by the engine): the same bytes read
as int32 words of 8 weights (nibble i of a word, weight 8m + i, at bits 4i), each pair of
nibbles shifted once so that they sit at mantissa bits 15-18 and 19-22, then masked and
given the exponents of 256.0 and 16.0 in one LOP3 each: the floats 256 + q and 16 + q, exact, with no int-to-float
conversion (an I2F issues at 16 a clock per SM on sm_90, an FFMA at 128). So sum(v x) =
sum(q x) + 256 sum(x at even slots) + 16 sum(x at odd ones), and the last two, shared by
every row, are subtracted once per group: an fp32 result within a few 1e-6 of the exact one,
relative (the floats 256 + q give up 8 of fp32's 24 bits; bf16 keeps 8). x's 8 values for a
word are one load, split in registers. Compiled for sm_90 (bench.w4a16_sass) at the four
blocks the H200 chose for the byte kernel, its loop takes 4.7-6.2 instructions a weight with
Triton 3.6 (the H200's) and 3.9-5.0 with 3.9, and no conversion; the byte kernel's 5.9-7.0,
one of them an I2F. (Triton 3.6's ptxas leaves (a & b) | c as two instructions: on a GPU the
masks are written as PTX lop3, one each.) On the H200 it lost at every 8B shape, 0.76-0.93x the
byte kernel's speed: neither the conversions nor the instruction count bound these GEMVs, so
the engine times only the byte kernel (ENGINE_KERNELS).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import HAS_TRITON, INTERPRET

GROUP = 32
MAX_ROWS = 16  # rows of x one launch multiplies (an unrolled pass each over the unpacked weights)

# The word kernel's masks as PTX lop3 (immLut 0xEA: (a & b) | c): nibbles at bits 15-18 into
# 256.0's mantissa, at bits 19-22 into 16.0's
LO_MASK, LO_EXP, HI_MASK, HI_EXP, AND_OR_LUT = 0x78000, 0x43800000, 0x780000, 0x41800000, 0xEA

if HAS_TRITON:
    import triton
    import triton.language as tl

    LO_ASM: tl.constexpr = tl.constexpr(
        f"lop3.b32 $0, $1, {LO_MASK:#x}, {LO_EXP:#x}, {AND_OR_LUT:#x};"
    )
    HI_ASM: tl.constexpr = tl.constexpr(
        f"lop3.b32 $0, $1, {HI_MASK:#x}, {HI_EXP:#x}, {AND_OR_LUT:#x};"
    )

    @triton.jit
    def _group_scales(SCALE, ZERO, rows, row_ok, stride_s, g):
        """The scales and zero points [BLOCK_N, G] of groups g of the rows, in fp32."""
        at = rows[:, None] * stride_s + g[None, :]
        s = tl.load(SCALE + at, mask=row_ok[:, None], other=0.0).to(tl.float32)
        z = tl.load(ZERO + at, mask=row_ok[:, None], other=0.0).to(tl.float32)
        return s, z

    @triton.jit
    def _store_rows(OUT, acc, ts, T, rows, row_ok, stride_ot):
        """acc [BLOCK_T, BLOCK_N] (x's rows t < T, the weight's rows) in OUT's dtype."""
        t_ok = ts < T
        tl.store(OUT + ts[:, None] * stride_ot + rows[None, :], acc.to(OUT.dtype.element_ty),
                 mask=t_ok[:, None] & row_ok[None, :])  # fmt: skip

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
        G: tl.constexpr = BLOCK_K // 32
        half = tl.arange(0, BLOCK_K // 2)
        groups = tl.arange(0, G)
        ts = tl.arange(0, BLOCK_T)
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        k_lo = split * K_SHARE
        for k0 in range(k_lo, k_lo + K_SHARE, BLOCK_K):
            # the packed bytes of BLOCK_K weights of each row, [BLOCK_N, G, 16]: byte j holds
            # weight 2j (low nibble) and 2j + 1 (high), so it meets x's even and odd entries
            b = tl.load(
                PACKED + rows[:, None] * stride_p + (k0 // 2 + half)[None, :],
                mask=row_ok[:, None], other=0,
            ).to(tl.int32)  # fmt: skip
            lo = tl.reshape(b & 15, (BLOCK_N, G, 16)).to(tl.float32)
            hi = tl.reshape(b >> 4, (BLOCK_N, G, 16)).to(tl.float32)
            s, z = _group_scales(SCALE, ZERO, rows, row_ok, stride_s, k0 // 32 + groups)
            # sum_k (q_k s + z) x_k = s * sum_k q_k x_k + z * sum_k x_k, per group of 32
            for t in tl.static_range(BLOCK_T):
                xt = X + t * stride_x + k0 + 2 * half
                t_ok = (half * 0 + t) < T
                xe = tl.reshape(tl.load(xt, mask=t_ok, other=0.0).to(tl.float32), (G, 16))
                xo = tl.reshape(tl.load(xt + 1, mask=t_ok, other=0.0).to(tl.float32), (G, 16))
                qx = tl.sum(lo * xe[None, :, :] + hi * xo[None, :, :], axis=2)  # [BLOCK_N, G]
                xs = tl.sum(xe + xo, axis=1)  # [G]
                part = tl.sum(s * qx + z * xs[None, :], axis=1)  # [BLOCK_N]
                acc = tl.where((ts == t)[:, None], acc + part[None, :], acc)
        _store_rows(OUT + split * stride_os, acc, ts, T, rows, row_ok, stride_ot)

    @triton.jit
    def _nibble_pair(w, SHIFT: tl.constexpr, ASM: tl.constexpr):
        """Nibbles 2m and 2m + 1 of int32 words w (bits 8m..8m+7) as the floats 256 + q and
        16 + q: w shifted by SHIFT (right; negative: left) puts them at bits 15-18 and 19-22,
        inside the mantissas of 256.0 (0x43800000) and 16.0 (0x41800000). ASM: each as one
        lop3 ((a & b) | c), which an older ptxas (Triton 3.6's) leaves as two instructions."""
        u = w >> SHIFT if SHIFT > 0 else w << -SHIFT
        if ASM:
            lo = tl.inline_asm_elementwise(LO_ASM, "=r,r", [u], dtype=tl.int32, is_pure=True,
                                           pack=1)  # fmt: skip
            hi = tl.inline_asm_elementwise(HI_ASM, "=r,r", [u], dtype=tl.int32, is_pure=True,
                                           pack=1)  # fmt: skip
        else:
            lo = (u & 0x78000) | 0x43800000
            hi = (u & 0x780000) | 0x41800000
        return lo.to(tl.float32, bitcast=True), hi.to(tl.float32, bitcast=True)

    @triton.jit
    def _w4a16_words_kernel(
        X, WORDS, SCALE, ZERO, OUT, T, N, K, K_SHARE,
        stride_x, stride_w, stride_s, stride_os, stride_ot,
        BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
    ):  # fmt: skip
        """_w4a16_kernel's result from int32 words of 8 weights, their nibbles turned to
        floats by bit masks (the module's docstring). ASM: the masks as inline PTX (on a
        GPU; the interpreter runs the same operations in Triton)."""
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        G: tl.constexpr = BLOCK_K // 32
        groups = tl.arange(0, G)
        j4 = tl.arange(0, 4)  # the 4 words of a group
        e8 = tl.arange(0, 8)  # the 8 weights of a word
        ts = tl.arange(0, BLOCK_T)
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        k_lo = split * K_SHARE
        for k0 in range(k_lo, k_lo + K_SHARE, BLOCK_K):
            # [BLOCK_N, G, 4]: word j of group g holds weights 32g + 8j .. 32g + 8j + 7
            # (a K block's words and x's values start at multiples of BLOCK_K: said to the
            # compiler, they load in 16-byte vectors)
            kw = tl.multiple_of(k0 // 8, BLOCK_K // 8)
            w = tl.load(
                WORDS + rows[:, None, None] * stride_w + (kw + groups * 4)[None, :, None]
                + j4[None, None, :], mask=row_ok[:, None, None], other=0,
            )  # fmt: skip
            v0, v1 = _nibble_pair(w, -15, ASM)
            v2, v3 = _nibble_pair(w, -7, ASM)
            v4, v5 = _nibble_pair(w, 1, ASM)
            v6, v7 = _nibble_pair(w, 9, ASM)
            s, z = _group_scales(SCALE, ZERO, rows, row_ok, stride_s, k0 // 32 + groups)
            for t in tl.static_range(BLOCK_T):
                # a word's 8 values of x in one load, [G, 4, 8], split into the 8 slots
                xt = X + t * stride_x + tl.multiple_of(k0, BLOCK_K) + groups[:, None, None] * 32
                t_ok = (e8[None, None, :] * 0 + j4[None, :, None] * 0 + t) < T
                x8 = tl.load(xt + j4[None, :, None] * 8 + e8[None, None, :], mask=t_ok,
                             other=0.0).to(tl.float32)  # fmt: skip
                ev, od = tl.split(tl.reshape(x8, (G, 4, 4, 2)))  # slots 0 2 4 6 | 1 3 5 7
                ev04, ev26 = tl.split(tl.reshape(ev, (G, 4, 2, 2)))
                od15, od37 = tl.split(tl.reshape(od, (G, 4, 2, 2)))
                x0, x4 = tl.split(ev04)
                x2, x6 = tl.split(ev26)
                x1, x5 = tl.split(od15)
                x3, x7 = tl.split(od37)
                d = v0 * x0[None] + v1 * x1[None] + v2 * x2[None] + v3 * x3[None]
                d += v4 * x4[None] + v5 * x5[None] + v6 * x6[None] + v7 * x7[None]
                # sum v x = sum q x + 256 sum(x at even slots) + 16 sum(x at odd ones)
                even, odd = x0 + x2 + x4 + x6, x1 + x3 + x5 + x7  # [G, 4]
                offset = tl.sum(even * 256.0 + odd * 16.0, axis=1)  # [G]
                qx = tl.sum(d, axis=2) - offset[None, :]  # [BLOCK_N, G]
                part = tl.sum(s * qx + z * tl.sum(even + odd, axis=1)[None, :], axis=1)
                acc = tl.where((ts == t)[:, None], acc + part[None, :], acc)
        _store_rows(OUT + split * stride_os, acc, ts, T, rows, row_ok, stride_ot)

    @triton.jit
    def _sum_splits_kernel(PARTS, OUT, SPLIT, TN, BLOCK: tl.constexpr):
        """OUT[i] = sum over s of PARTS[s, i] in s order (fp32), in OUT's dtype."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < TN
        acc = tl.load(PARTS + offs, mask=ok, other=0.0)
        for s in range(1, SPLIT):
            acc += tl.load(PARTS + s * TN + offs, mask=ok, other=0.0)
        tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=ok)


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


# a configuration: (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, kernel), kernel "bytes"
# (_w4a16_kernel) or "words" (_w4a16_words_kernel)
Config = tuple[int, int, int, int, str]
KERNELS = ("bytes", "words")
# the configuration per weight shape and device, chosen by timing
_CHOSEN: dict[tuple, Config] = {}


def _splits(n: int, k: int, block_n: int, block_k: int) -> int:
    """The K split that gives an H200's 132 SMs a few programs each, each streaming a long
    run of K (a share of K a multiple of BLOCK_K)."""
    programs = triton.cdiv(n, block_n)
    split = 1
    while programs * split < 4 * 132 and k // (block_k * split * 2) >= 4 and \
            k % (block_k * split * 2) == 0:  # fmt: skip
        split *= 2
    return split


# the kernels the engine times at load: the word kernel lost to the byte kernel at every 8B
# shape on the H200 (0.76-0.93x its speed, bench.w4a16_speed, docs/benchmarks.md), so only the
# benchmarks time it
ENGINE_KERNELS = ("bytes",)


def candidates(n: int, k: int, kernels: tuple[str, ...] = ENGINE_KERNELS) -> list[Config]:
    """The configurations a GPU times for one weight shape: the default first (the byte
    kernel), then the word kernel's (16 or 32 rows) where `kernels` names it."""
    out = []
    for kernel in kernels:
        # (the word kernel's 64 rows, compiled for sm_90 by Triton 3.6, take 2.3x the
        # instructions a weight and row of 32 at a verification's 4 rows, spilling registers:
        # bench.w4a16_sass)
        for block_k in (128, 256, 512, 1024):
            if k % block_k:
                continue
            for block_n in (16, 32, 64) if kernel == "bytes" else (16, 32):
                split = _splits(n, k, block_n, block_k)
                for s in (split // 2, split, split * 2):
                    if s >= 1 and k % (block_k * s) == 0:
                        for warps in (4, 8):
                            out.append((block_n, block_k, s, warps, kernel))
    return out or [(32, 32, 1, 4, "bytes")]


def timed_configs() -> dict[str, Config]:
    """The configuration timed for each weight shape so far ("NxK": (BLOCK_N, BLOCK_K,
    SPLIT_K, num_warps, kernel)), for benchmark reports."""
    return {f"{n}x{k}": c for (n, k, _, _), c in _CHOSEN.items()}


SUM_BLOCK = 1024  # outputs a program of _sum_splits_kernel adds up


def launch(x, packed, scale, zero, config, T: int):
    """x [T, K] contiguous -> [T, N] in x's dtype by the given configuration (one of
    candidates()): one kernel with K in one share, two with K split."""
    block_n, block_k, split, warps, kernel = config
    N, K = packed.shape[0], x.shape[1]
    weights, fn = packed, _w4a16_kernel
    if kernel == "words":  # the same bytes as int32 words (K is a multiple of 32)
        if packed.stride(1) != 1 or packed.data_ptr() % 4 or packed.stride(0) % 4:
            raise ValueError("w4a16: the word kernel reads packed rows as aligned int32 words")
        weights, fn = packed.view(torch.int32), _w4a16_words_kernel
    out = torch.empty(T, N, device=x.device, dtype=x.dtype)
    parts = out if split == 1 else torch.empty(split, T, N, device=x.device, dtype=torch.float32)
    block_t = 1 if T == 1 else triton.next_power_of_2(T)
    extra = {"ASM": x.is_cuda and not INTERPRET} if kernel == "words" else {}
    fn[(triton.cdiv(N, block_n), split)](
        x, weights, scale, zero, parts, T, N, K, K // split,
        x.stride(0), weights.stride(0), scale.stride(0), parts.stride(0) if split > 1 else 0,
        parts.stride(-2), BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
        **extra,
    )  # fmt: skip
    if split > 1:
        _sum_splits_kernel[(triton.cdiv(T * N, SUM_BLOCK),)](
            parts, out, split, T * N, BLOCK=SUM_BLOCK, num_warps=4
        )
    return out


def time_configs(x, packed, scale, zero, configs: list[Config]) -> dict[Config, float]:
    """Each configuration's median ms for x's rows on a GPU (triton.testing.do_bench, the L2
    flushed before each launch); one that does not build here (this Triton, this GPU) is
    left out."""
    times = {}
    for c in configs:
        try:
            launch(x, packed, scale, zero, c, x.shape[0])  # (compiled first)
        except Exception:  # noqa: BLE001 (a kernel this Triton or GPU cannot build)
            continue
        times[c] = triton.testing.do_bench(
            lambda c=c: launch(x, packed, scale, zero, c, x.shape[0]), warmup=2, rep=12,
            return_mode="median",
        )  # fmt: skip
    return times


def _config(x, packed, scale, zero) -> Config:
    """The blocks for this weight: on a GPU the fastest of candidates for one row, timed
    once per shape (outside a CUDA graph's capture: the engine's warm-up step comes
    first); the same for every row count, so that a row sums alike in a 1-row step and in a
    verification's rows. In the interpreter: the first candidate.

    Each launch is timed alone after the L2 cache is flushed (triton.testing.do_bench, the
    median): a decode step reads each weight once, from HBM, while back-to-back launches
    over one weight (12.6 MB for the 8B's qkv) read it from the 50 MB L2, which favoured
    the configurations that suit a hot cache (time_configs)."""
    N, K = packed.shape[0], x.shape[1]
    key = (N, K, x.dtype, x.device)
    chosen = _CHOSEN.get(key)
    if chosen is not None:
        return chosen
    cands = candidates(N, K)
    if not x.is_cuda or torch.cuda.is_current_stream_capturing():
        return cands[0]
    one = x[:1].contiguous()
    times = time_configs(one, packed, scale, zero, cands)
    if not times:  # (the default's own error, raised where it can be read)
        launch(one, packed, scale, zero, cands[0], 1)
    _CHOSEN[key] = chosen = min(times, key=times.get)
    return chosen


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
    return launch(x, packed, scale, zero, _config(x, packed, scale, zero), T)
