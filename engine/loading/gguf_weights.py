"""GGUF tensors -> the model's weights: HF names, dequantized float32, and the quantized
forms the CPU kernels take (engine.loading.gguf_quants says which weight gets which; the
files they go to are engine.loading.gguf_checkpoint's)."""

from __future__ import annotations

import mmap
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.loading import gguf_quants
from engine.loading.gguf_reader import TensorInfo, meta, raw, unreadable

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_LINEAR_RE = re.compile(
    r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight"
)
ROPE_FREQS = "rope_freqs.weight"  # llama3-style rope scaling, turned into config, not a weight


def hf_name(name: str) -> str | None:
    """The HF name of GGUF tensor `name`, or None for a tensor the model has no place for."""
    if m := _BLOCK_RE.fullmatch(name):
        part = _BLOCK_NAMES.get(m[2])
        return part and f"model.layers.{m[1]}.{part}.{m[3]}"
    base, _, suffix = name.rpartition(".")
    part = _GLOBAL_NAMES.get(base)
    return part and f"{part}.{suffix}"


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`, which reorders each head's q/k rows from HF's
    rotate-half layout (first half, second half) to interleaved pairs for its RoPE."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_weights(
    src: Path, buf: mmap.mmap, tensors: list[TensorInfo], metadata: dict[str, Any], arch: str
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """-> (HF weights in float32, the 4-bit arrays for Q4_FILE, the int8 ones for Q8_FILE);
    engine.loading.gguf_quants says which weight gets which form."""
    from gguf import GGMLQuantizationType

    plan = []
    for t in tensors:
        if t.name == ROPE_FREQS:
            plan.append((t, ROPE_FREQS))
            continue
        hf = hf_name(t.name)
        if hf is None:  # e.g. MoE experts in a Mixtral GGUF, which also says "llama"
            raise UnsupportedModelError(f"{src}: unsupported tensor {t.name!r} in a {arch} GGUF")
        plan.append((t, hf))
    names = {hf for _, hf in plan}
    head = "lm_head.weight" if "lm_head.weight" in names else "model.embed_tokens.weight"

    def load(item: tuple[TensorInfo, str]) -> tuple[np.ndarray, tuple | None, tuple | None]:
        """-> (float32 weight, (q, scale, zero) or None, (q, scale) or None)."""
        t, hf = item
        try:
            kind = GGMLQuantizationType(t.qtype).name
            linear = len(t.shape) == 2 and _LINEAR_RE.fullmatch(hf) is not None
            if linear and kind in gguf_quants.INT4_TYPES:
                weight, *q4 = gguf_quants.dequantize_int4(raw(buf, t), t.qtype, t.shape)
                return weight, tuple(q4), None  # one pass gives both forms
            weight = gguf_quants.dequantize(raw(buf, t), t.qtype, t.shape)
            # the output head gets int8 whatever its type, when the file quantized it
            int8 = (linear and kind in gguf_quants.INT8_TYPES) or (
                hf == head and kind in gguf_quants.INT4_TYPES + gguf_quants.INT8_TYPES
            )
            return weight, None, gguf_quants.int8_rows(weight) if int8 else None
        except NotImplementedError:
            raise UnsupportedModelError(
                f"{src}: tensor type {t.qtype} of {t.name!r} cannot be dequantized "
                "by the installed gguf package"
            ) from None
        except (ValueError, TypeError, MemoryError) as e:
            raise unreadable(src, e) from e

    # numpy releases the GIL inside its large array operations, so threads overlap well.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        arrays = list(pool.map(load, plan))
    weights, q4, q8 = {}, {}, {}
    for (_, hf), (weight, four, eight) in zip(plan, arrays, strict=True):
        weights[hf], base = weight, hf.removesuffix(".weight")
        if four is not None:
            q4[f"{base}.q"], q4[f"{base}.scale"], q4[f"{base}.zero"] = four
        if eight is not None:
            q8[f"{base}.q"], q8[f"{base}.scale"] = eight

    if arch == "llama":  # only llama.cpp's LlamaModel permutes q/k; Qwen converters do not
        n_head = meta(src, metadata, arch, "attention.head_count")
        n_kv = metadata.get(f"{arch}.attention.head_count_kv", n_head)
        for name in list(weights):
            heads = n_head if ".q_proj." in name else n_kv if ".k_proj." in name else 0
            if heads:
                if weights[name].shape[0] % (2 * heads):
                    raise ModelLoadError(f"{src}: {name} does not split into {heads} heads")
                weights[name] = unpermute(weights[name], heads)
                base = name.removesuffix(".weight")
                for arrays_of, part in ((q4, ".q"), (q4, ".scale"), (q4, ".zero"),
                                        (q8, ".q"), (q8, ".scale")):  # fmt: skip
                    if base + part in arrays_of:  # rows move with their scales
                        arrays_of[base + part] = unpermute(arrays_of[base + part], heads)
    return weights, q4, q8
