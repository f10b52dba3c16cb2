"""GGUF metadata -> the checkpoint's config.json and generation_config.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.loading.gguf_reader import meta
from engine.loading.gguf_weights import ROPE_FREQS

# GGUF architecture -> (HF class, model_type)
ARCHS = {
    "llama": ("LlamaForCausalLM", "llama"),  # Mistral GGUFs say "llama" too
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}


def checkpoint_config(
    src: Path, metadata: dict[str, Any], arch: str, weights: dict[str, np.ndarray]
) -> dict[str, Any]:
    """config.json of the model the GGUF holds (`weights`: its HF weights, by name)."""
    hf_class, model_type = ARCHS[arch]
    get = lambda key, default=None: metadata.get(f"{arch}.{key}", default)
    hidden = meta(src, metadata, arch, "embedding_length")
    n_head = meta(src, metadata, arch, "attention.head_count")
    head_dim = get("attention.key_length") or hidden // n_head
    rope_dim = get("rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise UnsupportedModelError(
            f"{src}: partial RoPE ({rope_dim} of {head_dim}) is not supported"
        )
    embed = weights.get("model.embed_tokens.weight")
    if embed is None:
        raise ModelLoadError(f"{src}: GGUF has no token_embd.weight tensor")
    bos, eos, pad = (
        metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding")
    )
    config: dict[str, Any] = {
        "architectures": [hf_class],
        "model_type": model_type,
        "vocab_size": int(embed.shape[0]),  # the embedding, not the token list: it may be padded
        "hidden_size": hidden,
        "intermediate_size": meta(src, metadata, arch, "feed_forward_length"),
        "num_hidden_layers": meta(src, metadata, arch, "block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": get("attention.head_count_kv", n_head),
        "head_dim": head_dim,
        "max_position_embeddings": get("context_length", 4096),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 10000.0),
        "rope_scaling": rope_scaling(src, metadata, arch, weights.pop(ROPE_FREQS, None)),
        "hidden_act": "silu",
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "use_cache": True,
        "torch_dtype": "float32",  # transformers < 5 reads this key
        "dtype": "float32",  # transformers >= 5 reads this one
    }
    if arch != "qwen2":  # Qwen2 always has q/k/v biases; llama and qwen3 say so in a flag
        config["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in weights
    if arch == "llama":
        config["mlp_bias"] = "model.layers.0.mlp.up_proj.bias" in weights
    if arch == "qwen2":
        config["use_sliding_window"] = False
    return config


def rope_scaling(
    src: Path, metadata: dict[str, Any], arch: str, rope_freqs: np.ndarray | None
) -> dict[str, Any] | None:
    get = lambda key, default=None: metadata.get(f"{arch}.{key}", default)
    if rope_freqs is not None:
        return _llama3_scaling(src, metadata, arch, rope_freqs)
    kind = get("rope.scaling.type", "none")
    factor = get("rope.scaling.factor") or get("rope.scale_linear")  # older files: scale_linear
    if kind == "none" and get("rope.scale_linear"):
        kind = "linear"
    if kind == "none" or not factor or factor == 1.0:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        scaling = {"rope_type": "yarn", "factor": factor}
        if orig := get("rope.scaling.original_context_length"):
            scaling["original_max_position_embeddings"] = orig
        return scaling
    raise UnsupportedModelError(f"{src}: unsupported RoPE scaling {kind!r}")


def _llama3_scaling(
    src: Path, metadata: dict[str, Any], arch: str, rope_freqs: np.ndarray
) -> dict[str, Any]:
    # GGUF stores llama3 scaling only as per-frequency divisors. Every Llama 3.x release uses
    # low/high frequency factors 1 and 4 over an original 8192 window with a varying factor,
    # so recompute those divisors and accept the file only when they match.
    factor = float(rope_freqs.max())
    orig = metadata.get(f"{arch}.rope.scaling.original_context_length", 8192)
    low, high = 1.0, 4.0
    dim = rope_freqs.shape[0] * 2
    inv_freq = 1.0 / metadata.get(f"{arch}.rope.freq_base", 10000.0) ** (np.arange(0, dim, 2) / dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (orig / wavelen - low) / (high - low)
    expected = np.where(
        wavelen < orig / high,
        1.0,
        np.where(wavelen > orig / low, factor, 1.0 / ((1 - smooth) / factor + smooth)),
    )
    if not np.allclose(expected, rope_freqs, rtol=1e-3):
        raise UnsupportedModelError(f"{src}: rope_freqs.weight is not llama3-style RoPE scaling")
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": orig,
    }


def generation_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json: the BOS, the stop tokens and the padding token."""
    ids = {k: metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "eot", "eom")}
    # Chat models often end a turn with a token other than EOS (Llama 3's <|eot_id|>).
    stops = list(dict.fromkeys(i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None))
    gen: dict[str, Any] = {"bos_token_id": ids["bos"]}
    gen["eos_token_id"] = stops[0] if len(stops) == 1 else (stops or None)
    if (pad := metadata.get("tokenizer.ggml.padding_token_id")) is not None:
        gen["pad_token_id"] = pad
    return gen


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
