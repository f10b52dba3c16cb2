"""GGUF weight blocks -> float32, and the quantized forms the CPU kernels of
engine.loading.quant take.

The float32 weight (model.safetensors, the exact reference) is always gguf's own maths. A
linear weight also gets one quantized form, by its GGUF type:

    Q4_0, Q4_1, Q4_K            4-bit q, with a scale and a zero per 32 weights along K:
                                W = q * scale + zero reproduces the float32 weight bit for bit
                                (Int4Linear: torch's int4 kernel)
    Q5_0, Q5_1, Q5_K, Q6_K,     int8 per output row, requantized from the float32 weight:
    Q8_0                        W ~ q * scale[n], |error| <= scale[n] / 2
                                (Int8Linear: torch's int8 kernel)

A Q4_K super-block is 256 weights in eight groups of 32, each with a 6-bit scale and min:
W = d * sc * q - dmin * m, so scale = d * sc and zero = -dmin * m, both exact in float32
(an fp16 times a 6-bit integer needs at most 17 significant bits; times q < 16, at most 21).
The 5-, 6- and 8-bit types have no kernel of their own in torch: per-row int8 reads a byte
per weight (5.5 to 8.5 bits in the file) and its step, max |W[n]| / 127, is finer than the
file's own (a Q5_0 group's is max |W[group]| / 16).

Only conversion imports this module, so numpy and a lazily imported gguf are all it needs.
"""

from __future__ import annotations

import math

import numpy as np

GROUP = 32  # weights per scale and zero of the 4-bit form (the int4 kernel's group size)
CHUNK_BYTES = 4 << 20  # quantized bytes per numpy call: large calls, bounded temporaries
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
INT8_TYPES = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")


def dequantize(raw: np.ndarray, qtype: int, shape: tuple[int, ...]) -> np.ndarray:
    """raw: a tensor's bytes (uint8) -> its float32 values, by gguf's own maths."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    qtype = GGMLQuantizationType(qtype)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = raw.reshape(-1, shape[-1] // block * block_bytes)
    if qtype == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(shape).copy()  # copy: the map is closed later
    kind = getattr(quants, qtype.name, None)
    if qtype == GGMLQuantizationType.F16 or not hasattr(kind, "dequantize_rows"):
        out = quants.dequantize(raw, qtype)  # raises NotImplementedError for unknown types
    else:
        # Same math as quants.dequantize, which works 16 rows at a time; with ~4 MiB chunks
        # numpy does the work in a few large calls instead of thousands (~3x faster).
        kind.init_grid()  # the IQ types' lookup tables; a no-op for the others
        step = max(1, CHUNK_BYTES // raw.shape[1])
        out = np.concatenate(
            [kind.dequantize_rows(raw[i : i + step]) for i in range(0, len(raw), step)]
        )
    return out.reshape(shape).astype(np.float32, copy=False)


def dequantize_int4(raw: np.ndarray, qtype: int, shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """A Q4_0, Q4_1 or Q4_K tensor's bytes -> (float32 weight, q, scale, zero): q uint8
    [N, K] in 0..15, scale and zero float32 [N, K // 32]; one pass gives both forms."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType(qtype)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    decode = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k}[qtype.name]
    rows, cols = math.prod(shape[:-1]), shape[-1]
    raw = raw.reshape(rows, cols // block, block_bytes)
    weight = np.empty((rows, cols), np.float32)
    q = np.empty((rows, cols // GROUP, GROUP), np.uint8)
    scale = np.empty((rows, cols // GROUP), np.float32)
    zero = np.empty((rows, cols // GROUP), np.float32)
    step = max(1, CHUNK_BYTES // (raw.shape[1] * block_bytes))
    for i in range(0, rows, step):
        chunk = q[i : i + step]
        s, z = decode(raw[i : i + step], chunk.reshape(len(chunk), raw.shape[1], -1, GROUP))
        # the same float32 operations, in the same order, as gguf.quants' dequantize_blocks
        weight[i : i + step] = (s[..., None] * chunk.astype(np.float32) + z[..., None]).reshape(
            len(chunk), cols
        )
        scale[i : i + step], zero[i : i + step] = s, z
    return (
        weight.reshape(shape),
        q.reshape(shape),
        scale.reshape(*shape[:-1], cols // GROUP),
        zero.reshape(*shape[:-1], cols // GROUP),
    )


# Each decoder: blocks uint8 [rows, blocks per row, block bytes]; writes the 4-bit values into
# q [rows, blocks per row, groups per block, 32] and returns scale and zero [rows, groups].


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[..., at : at + 2].view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray, q: np.ndarray) -> None:
    """qs [..., 16]: byte j holds weight j (low nibble) and j + 16 (high) of a 32-group."""
    np.bitwise_and(qs, 0x0F, out=q[..., :16])
    np.right_shift(qs, 4, out=q[..., 16:])


def _q4_0(blocks: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # w = d (q - 8) = d q - 8 d, exactly in fp32: d is an fp16 and q < 16, so d q and
    # d (q - 8) need at most 15 significant bits.
    d = _half(blocks, 0)
    _nibbles(blocks[..., None, 2:], q)
    return d, d * -8.0


def _q4_1(blocks: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _nibbles(blocks[..., None, 4:], q)
    return _half(blocks, 0), _half(blocks, 2)  # w = d q + m


def _q4_k(blocks: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # 144 bytes: d, dmin (fp16), 12 bytes of 6-bit scales and mins for the 8 groups, then
    # 4 x 32 bytes: byte l of run j holds weight l of group 2j (low nibble) and 2j + 1 (high).
    rows, per_row = blocks.shape[:2]
    sc, m = _k_scale_min(blocks[..., 4:16])
    qs = blocks[..., 16:].reshape(rows, per_row, 4, 1, 32)
    pairs = q.reshape(rows, per_row, 4, 2, 32)
    np.bitwise_and(qs, 0x0F, out=pairs[..., 0:1, :])
    np.right_shift(qs, 4, out=pairs[..., 1:2, :])
    d = _half(blocks, 0)[..., None] * sc.astype(np.float32)
    dm = _half(blocks, 2)[..., None] * m.astype(np.float32)
    return d.reshape(rows, -1), -dm.reshape(rows, -1)  # w = d sc q - dmin m


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 scales and 8 mins of 6 bits (ggml's get_scale_min_k4):
    bytes 0-3 hold scales 0-3 and the top bits of scales 4-7, bytes 4-7 the mins likewise,
    bytes 8-11 the low 4 bits of scales (low nibble) and mins (high nibble) 4-7."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mins


def int8_rows(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """weight float32 [N, K] -> (q int8 [N, K], scale float32 [N]) with weight ~ q * scale,
    |error| <= scale / 2. Each scale is rounded to a bfloat16 (the int8 kernel's scale type),
    so the kernel's weights are exactly q * scale; the row's largest weight then falls within
    127 +- 0.25 steps and still rounds to +-127."""
    rows = weight.reshape(-1, weight.shape[-1])
    q = np.empty(rows.shape, np.int8)
    scale = np.empty(len(rows), np.float32)
    step = max(1, CHUNK_BYTES // max(1, rows.shape[1]))
    for i in range(0, len(rows), step):
        chunk = rows[i : i + step]
        s = np.maximum(np.abs(chunk).max(axis=1), np.float32(1e-30)) / np.float32(127)
        s = _to_bf16(s)
        scale[i : i + step] = s
        q[i : i + step] = np.clip(np.rint(chunk / s[:, None]), -127, 127)
    return q.reshape(weight.shape), scale.reshape(weight.shape[:-1])


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """Finite float32 -> the nearest bfloat16 (ties to even), as float32; as torch rounds."""
    bits = x.astype(np.float32).view(np.uint32)
    bits = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (bits & np.uint32(0xFFFF0000)).view(np.float32)
