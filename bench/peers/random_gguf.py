"""A GGUF of random weights in a real model's shape, for llama.cpp runs of shapes whose weights
are not on the machine (the Llama-3.1-8B shape on the H200, which has no network).

    python -m bench.peers.random_gguf OUT.gguf [--preset llama-3.1-8b] [--gguf-py DIR]

Written with llama.cpp's own gguf-py (--gguf-py: the sdist's llama.cpp/gguf-py; else the
installed `gguf`), in f16 with f32 norms, as llama.cpp's converter writes an f16 model. Quantize
it with llama-quantize. The shapes are the engine's dummy presets
(engine.loading.loader.DUMMY_PRESETS), so llama.cpp and `dummy:PRESET` runs of our engine read
the same bytes per token.

Values: a pool of 2^24 N(0, 0.02) draws (seeded) laid out at random offsets, tensor after tensor:
the same statistics as fresh draws at memory speed (8B fresh normals take minutes). The file has
no tokenizer (`tokenizer.ggml.model = "none"`, with the vocab size): llama-bench feeds random ids.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

POOL = 1 << 24
STD = 0.02


def import_gguf(gguf_py: Path | None = None):
    """llama.cpp's gguf-py from a source folder when given, else the installed package."""
    if gguf_py is not None:
        if not (Path(gguf_py) / "gguf" / "gguf_writer.py").is_file():
            raise SystemExit(f"error: {gguf_py} is not llama.cpp's gguf-py folder")
        sys.path.insert(0, str(gguf_py))
    try:
        import gguf
    except ImportError:
        raise SystemExit(
            "error: the gguf package is missing; pass --gguf-py <llama.cpp source>/gguf-py"
        ) from None
    return gguf


def llama3_rope_factors(cfg: dict[str, Any]) -> np.ndarray | None:
    """rope_freqs.weight, as llama.cpp's converter computes it for rope_type "llama3"."""
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type") != "llama3":
        return None
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base = cfg.get("rope_theta", 10000.0)
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * base ** (i / dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def tensor_shapes(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, numpy shape, "f16" | "f32") in llama.cpp's order for a Llama model."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    out = [("token_embd.weight", (v, h), "f16"), ("output_norm.weight", (h,), "f32")]
    if not cfg.get("tie_word_embeddings"):
        out.append(("output.weight", (v, h), "f16"))
    if llama3_rope_factors(cfg) is not None:
        out.append(("rope_freqs.weight", (d // 2,), "f32"))
    for n in range(cfg["num_hidden_layers"]):
        b = f"blk.{n}."
        out += [
            (b + "attn_norm.weight", (h,), "f32"),
            (b + "attn_q.weight", (q, h), "f16"),
            (b + "attn_k.weight", (kv, h), "f16"),
            (b + "attn_v.weight", (kv, h), "f16"),
            (b + "attn_output.weight", (h, q), "f16"),
            (b + "ffn_norm.weight", (h,), "f32"),
            (b + "ffn_gate.weight", (i, h), "f16"),
            (b + "ffn_up.weight", (i, h), "f16"),
            (b + "ffn_down.weight", (h, i), "f16"),
        ]
    return out


def write(path: Path, cfg: dict[str, Any], name: str, seed: int = 0, gguf_py: Path | None = None):
    """Writes the GGUF tensor by tensor (memory: the largest tensor, not the model)."""
    if (cfg.get("architectures") or [None])[0] not in ("LlamaForCausalLM", "MistralForCausalLM"):
        raise SystemExit(
            f"error: only Llama-shaped configs are written, not {cfg.get('architectures')}"
        )
    gguf = import_gguf(gguf_py)
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_rope_dimension_count(d)
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("none")
    shapes = tensor_shapes(cfg)
    dt = {"f16": np.float16, "f32": np.float32}
    for tname, shape, kind in shapes:
        nbytes = math.prod(shape) * np.dtype(dt[kind]).itemsize
        w.add_tensor_info(tname, shape, np.dtype(dt[kind]), nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(POOL, dtype=np.float32) * STD).astype(np.float16)
    rope = llama3_rope_factors(cfg)
    for tname, shape, kind in shapes:
        if tname == "rope_freqs.weight":
            data = rope
        elif kind == "f32":  # RMSNorm weights
            data = np.ones(shape, dtype=np.float32)
        else:
            data = _from_pool(pool, math.prod(shape), rng).reshape(shape)
        w.write_tensor_data(data)
    w.close()
    return path


def _from_pool(pool: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    out = np.empty(n, dtype=pool.dtype)
    pos = 0
    while pos < n:
        off = int(rng.integers(0, len(pool)))
        take = min(n - pos, len(pool) - off)
        out[pos : pos + take] = pool[off : off + take]
        pos += take
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.random_gguf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("out", type=Path)
    ap.add_argument(
        "--preset", default="llama-3.1-8b", help="a dummy preset of engine.loading.loader"
    )
    ap.add_argument("--gguf-py", type=Path, help="llama.cpp's gguf-py folder (the sdist's)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from engine.loading.loader import DUMMY_PRESETS

    if args.preset not in DUMMY_PRESETS:
        print(
            f"error: unknown preset {args.preset!r}; use {', '.join(DUMMY_PRESETS)}",
            file=sys.stderr,
        )
        return 1
    write(args.out, DUMMY_PRESETS[args.preset], f"random {args.preset}", args.seed, args.gguf_py)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
