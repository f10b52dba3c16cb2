"""Turn a .gguf file into a Hugging Face style checkpoint directory, cached on disk.

The engine loads HF checkpoints (config.json, model.safetensors, tokenizer files). A GGUF holds
the same model in llama.cpp's layout, so we convert it once and reuse the result. Only the
conversion needs the `gguf` package, so it is imported inside functions: machines that only
load cached checkpoints need not have it.

Quantized linear weights also keep a quantized form for the CPU's quantized kernels
(engine.quant; engine.gguf_quants says which type gets which). For each HF weight `<name>`:
- Q4_FILE (a safetensors file), for Q4_0, Q4_1 and Q4_K:
    <name>.q      uint8   [N, K]       the 4-bit values, 0..15
    <name>.scale  float32 [N, K // 32]
    <name>.zero   float32 [N, K // 32]
  W[n, k] = q[n, k] * scale[n, k // 32] + zero[n, k // 32] in float32 reproduces the weight
  in model.safetensors bit for bit (Q4_1: scale = d, zero = m; Q4_0: scale = d, zero = -8 d;
  Q4_K: scale = d sc, zero = -dmin m).
- Q8_FILE, for Q5_0, Q5_1, Q5_K, Q6_K and Q8_0, and for the output head (the token
  embedding when tied) of any of these types or the Q4 ones:
    <name>.q      int8    [N, K]       W[n, k] ~ q[n, k] * scale[n], to within scale[n] / 2
    <name>.scale  float32 [N]          each a bfloat16 value (the int8 kernel's scale type)
Rows are un-permuted like the dense q/k weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import mmap
import os
import re
import shutil
import struct
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine import gguf_quants, paths
from engine.errors import ModelLoadError, ModelNotFoundError, UnsupportedModelError
from engine.gguf_parts import as_parts, open_buffer

_FORMAT_VERSION = 3  # part of the cache key: bump it when the converted output changes
_DONE = "gguf_source.json"  # written last; a directory without it is not a finished conversion
_EDGE = 1 << 20  # bytes hashed from each end of the file for the cache key
_UNUSED_S = 7 * 24 * 3600  # a conversion whose source is gone goes after a week unused
_STALE_TMP_S = 24 * 3600  # temp dirs older than this are leftovers of a crashed conversion
# Not "*.safetensors": loader.load_checkpoint_weights loads every file named so.
Q4_FILE = "model.q4"
Q8_FILE = "model.q8"
Q4_GROUP = gguf_quants.GROUP  # weights per scale and zero in Q4_FILE

# GGUF architecture -> (HF class, model_type)
_ARCHS = {
    "llama": ("LlamaForCausalLM", "llama"),  # Mistral GGUFs say "llama" too
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}
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
_ROPE_FREQS = "rope_freqs.weight"  # llama3-style rope scaling, turned into config, not a weight

# GGUF metadata value types with a fixed size (8 is string, 9 is array).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}
_F32 = 6


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # numpy/HF order; ggml lists dimensions fastest-moving first
    qtype: int  # ggml type id
    start: int  # absolute byte offset in the file
    nbytes: int


def gguf_to_checkpoint(
    path: str | os.PathLike | Sequence[str | os.PathLike],
    cache_root: Path | None = None,
    name: str | None = None,
) -> Path:
    """Convert `path` into an HF checkpoint directory (cached) and return that directory.

    path: a .gguf file, or the ordered part files of one split GGUF (engine.gguf_parts),
    read in place. name: what the cache directory is called after (default: the file's)."""
    parts = as_parts(path)
    src = parts[0] if len(parts) == 1 else Path(f"{name or parts[0].stem} ({len(parts)} parts)")
    for part in parts:
        if not part.is_file():
            what = " (a directory, not a .gguf file)" if part.is_dir() else ""
            raise ModelNotFoundError(f"model file not found: {part}{what}")
    root = Path(cache_root) if cache_root is not None else paths.cache_dir() / "gguf"
    try:
        key = _cache_key(parts)
    except OSError as e:
        raise ModelLoadError(f"{src}: cannot read the file ({e.strerror or e})") from e
    stem = name or parts[0].stem
    final = root / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', stem)[:60]}-{key[:16]}"
    if (final / _DONE).is_file():
        with contextlib.suppress(OSError):  # in use: see _remove_dead_conversions
            os.utime(final / _DONE)
        return final

    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_tmp(root)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    except OSError as e:
        raise ModelLoadError(f"cannot create the model cache in {root} ({e.strerror or e})") from e
    try:
        _convert(src, parts, tmp)
        source = [str(p.resolve()) for p in parts]
        marker = {"source": source[0] if len(source) == 1 else source, "key": key}
        marker["format_version"] = _FORMAT_VERSION
        _write_json(tmp / _DONE, marker)
        _publish(tmp, final)
        _remove_dead_conversions(root, final)
    except OSError as e:
        raise ModelLoadError(
            f"cannot write the converted model to {root} ({e.strerror or e})"
        ) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op once published
    return final


def _cache_key(parts: Sequence[Path]) -> str:
    # Path, size and mtime catch the usual edits; the two ends of the content catch a file
    # replaced in place with the same size and a preserved mtime. A single file keeps the
    # key it always had.
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{_FORMAT_VERSION}\0".encode())
    for src in parts:
        st = src.stat()
        h.update(f"{src.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        with open(src, "rb") as f:
            h.update(f.read(_EDGE))
            if st.st_size > _EDGE:
                f.seek(max(st.st_size - _EDGE, _EDGE))
                h.update(f.read(_EDGE))
    return h.hexdigest()


def _remove_stale_tmp(root: Path) -> None:
    now = time.time()
    for tmp in root.glob(".tmp-*"):
        try:
            if now - tmp.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass  # another process removed it first


def _remove_dead_conversions(root: Path, keep: Path) -> None:
    """Remove the conversions no file maps to any more: their source file changed (a new
    conversion of it exists or will), or it is gone and the conversion has not been used
    for _UNUSED_S (a reinstall into a new virtualenv leaves the old copy behind, 640 MB for
    the default model; a model on a drive that is not mounted today keeps its copy). A
    process still using one keeps its open files."""
    now = time.time()
    for entry in root.iterdir():
        if entry == keep or entry.name.startswith(".tmp-"):
            continue
        try:
            marker_path = entry / _DONE
            marker = json.loads(marker_path.read_text(encoding="utf-8"))
            source = as_parts(marker["source"])
            if all(p.is_file() for p in source):
                dead = _cache_key(source) != marker["key"]
            else:
                dead = now - marker_path.stat().st_mtime > _UNUSED_S
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a conversion of ours, or being written: leave it
        if dead:
            shutil.rmtree(entry, ignore_errors=True)


def _publish(tmp: Path, final: Path) -> None:
    if final.exists() and not (final / _DONE).is_file():
        shutil.rmtree(final, ignore_errors=True)  # not ours to trust: no completion marker
    try:
        os.replace(tmp, final)  # atomic: readers see a complete directory or none
    except OSError:
        if not (final / _DONE).is_file():
            raise
        # another process finished the same conversion first; keep its copy


def _convert(src: Path, parts: Sequence[Path], out: Path) -> None:
    try:
        import gguf  # noqa: F401  (only conversion needs it; fail with one line, not a trace)
    except ImportError as e:
        raise ModelLoadError(
            f"{src}: converting a GGUF file needs the gguf package; run: .venv/bin/pip install gguf"
        ) from e
    try:
        buf = open_buffer(parts)
    except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
        raise _unreadable(src, e) from e
    try:
        metadata, tensors = _read_header(src, buf)
        arch = metadata.get("general.architecture")
        if arch not in _ARCHS:
            raise UnsupportedModelError(
                f"{src}: unsupported GGUF architecture {arch!r}; supported: {', '.join(_ARCHS)}"
            )
        weights, q4, q8 = _read_weights(src, buf, tensors, metadata, arch)
    finally:
        # BufferError: a traceback still holds a view; the map closes when that is collected.
        with contextlib.suppress(BufferError):
            buf.close()

    if not metadata.get("tokenizer.ggml.tokens"):
        raise ModelLoadError(f"{src}: GGUF has no tokenizer (tokenizer.ggml.tokens)")
    try:
        config = _config(src, metadata, arch, weights)
    except (TypeError, ValueError, ZeroDivisionError) as e:  # metadata of the wrong type
        raise ModelLoadError(f"{src}: bad GGUF metadata ({e})") from e
    _save(weights, out / "model.safetensors", {"format": "pt"})
    del weights
    if q4:
        meta = {"format": "q4", "group_size": str(Q4_GROUP), "weight": "q * scale + zero"}
        _save(q4, out / Q4_FILE, meta)
    if q8:
        _save(q8, out / Q8_FILE, {"format": "q8", "weight": "q * scale (per row)"})
    del q4, q8
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", _generation_config(metadata))
    _write_tokenizer(src, metadata, out, config["max_position_embeddings"])


def _save(tensors: dict[str, np.ndarray], path: Path, metadata: dict[str, str]) -> None:
    """safetensors' save_file, its write errors (a full disk, say) raised as OSError."""
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        raise OSError(str(e).removeprefix("Error while serializing: ")) from e


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _unreadable(src: Path, why: object) -> ModelLoadError:
    reason = " ".join(str(why).split())[:120] or type(why).__name__
    return ModelLoadError(f"{src}: not a readable GGUF file ({reason})")


# ---- header --------------------------------------------------------------------------------
# Our own parser rather than gguf.GGUFReader: the reader builds a numpy memmap view per string
# and takes ~1.6 s on the default model's 100k vocabulary strings; this takes ~0.1 s.


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise ValueError(f"the file ends inside its header, at byte {self.size}")
        self.pos = start + n
        return start

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))

    def string(self) -> str:
        (n,) = self.unpack("<Q")
        start = self.take(n)
        return self.buf[start : start + n].decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            (v,) = self.unpack(_SCALARS[vtype])
            # float32 -> shortest decimal that round-trips (1e-05, not 9.999999747378752e-06)
            return float(str(np.float32(v))) if vtype == _F32 else v
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.unpack("<IQ")
            if etype in _SCALARS:
                dtype = np.dtype(_SCALARS[etype])
                start = self.take(count * dtype.itemsize)
                return np.frombuffer(self.buf, dtype, count, start).tolist()
            return [self.value(etype) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {vtype}")


def _read_header(src: Path, buf: mmap.mmap) -> tuple[dict[str, Any], list[_Tensor]]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        cur = _Cursor(buf)
        if buf[:4] != b"GGUF":
            raise ValueError("no GGUF magic bytes at the start")
        version, n_tensors, n_kv = cur.unpack("<4xIQQ")
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            (vtype,) = cur.unpack("<I")
            metadata[key] = cur.value(vtype)
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            (n_dims,) = cur.unpack("<I")
            if n_dims > 4:  # ggml's limit; more means a corrupt table
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
            dims = cur.unpack(f"<{n_dims}Q")
            qtype, offset = cur.unpack("<IQ")
            infos.append((name, tuple(reversed(dims)), qtype, offset))
        align = metadata.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0:
            raise ValueError(f"bad general.alignment {align!r}")
        data_start = -(-cur.pos // align) * align

        # Check every tensor's byte extent now: the data is memory-mapped, so a truncated file
        # would otherwise fail (or crash) only when a tensor is first read.
        tensors = []
        for name, shape, qtype, offset in infos:
            try:
                block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
            except (ValueError, KeyError):
                raise ValueError(f"tensor {name!r} has unknown type {qtype}") from None
            if not shape or shape[-1] % block:
                raise ValueError(f"tensor {name!r} has shape {shape}, not whole {block}-blocks")
            nbytes = math.prod(shape) // block * block_bytes
            start = data_start + offset
            if start + nbytes > len(buf):
                raise ValueError(
                    f"truncated: tensor {name!r} ends at byte {start + nbytes}, "
                    f"the file has {len(buf)}"
                )
            tensors.append(_Tensor(name, shape, qtype, start, nbytes))
    except (ValueError, struct.error, OverflowError, MemoryError, TypeError) as e:
        raise _unreadable(src, e) from e
    return metadata, tensors


# ---- weights -------------------------------------------------------------------------------


def _hf_name(name: str) -> str | None:
    if m := _BLOCK_RE.fullmatch(name):
        part = _BLOCK_NAMES.get(m[2])
        return part and f"model.layers.{m[1]}.{part}.{m[3]}"
    base, _, suffix = name.rpartition(".")
    part = _GLOBAL_NAMES.get(base)
    return part and f"{part}.{suffix}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`, which reorders each head's q/k rows from HF's
    rotate-half layout (first half, second half) to interleaved pairs for its RoPE."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _raw(buf: mmap.mmap, t: _Tensor) -> np.ndarray:
    return np.frombuffer(buf, np.uint8, t.nbytes, t.start)


def _read_weights(
    src: Path, buf: mmap.mmap, tensors: list[_Tensor], metadata: dict[str, Any], arch: str
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """-> (HF weights in float32, the 4-bit arrays for Q4_FILE, the int8 ones for Q8_FILE);
    engine.gguf_quants says which weight gets which form."""
    from gguf import GGMLQuantizationType

    plan = []
    for t in tensors:
        if t.name == _ROPE_FREQS:
            plan.append((t, _ROPE_FREQS))
            continue
        hf = _hf_name(t.name)
        if hf is None:  # e.g. MoE experts in a Mixtral GGUF, which also says "llama"
            raise UnsupportedModelError(f"{src}: unsupported tensor {t.name!r} in a {arch} GGUF")
        plan.append((t, hf))
    names = {hf for _, hf in plan}
    head = "lm_head.weight" if "lm_head.weight" in names else "model.embed_tokens.weight"

    def load(item: tuple[_Tensor, str]) -> tuple[np.ndarray, tuple | None, tuple | None]:
        """-> (float32 weight, (q, scale, zero) or None, (q, scale) or None)."""
        t, hf = item
        try:
            kind = GGMLQuantizationType(t.qtype).name
            linear = len(t.shape) == 2 and _LINEAR_RE.fullmatch(hf) is not None
            if linear and kind in gguf_quants.INT4_TYPES:
                weight, *q4 = gguf_quants.dequantize_int4(_raw(buf, t), t.qtype, t.shape)
                return weight, tuple(q4), None  # one pass gives both forms
            weight = gguf_quants.dequantize(_raw(buf, t), t.qtype, t.shape)
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
            raise _unreadable(src, e) from e

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
        n_head = _meta(src, metadata, arch, "attention.head_count")
        n_kv = metadata.get(f"{arch}.attention.head_count_kv", n_head)
        for name in list(weights):
            heads = n_head if ".q_proj." in name else n_kv if ".k_proj." in name else 0
            if heads:
                if weights[name].shape[0] % (2 * heads):
                    raise ModelLoadError(f"{src}: {name} does not split into {heads} heads")
                weights[name] = _unpermute(weights[name], heads)
                base = name.removesuffix(".weight")
                for arrays_of, part in ((q4, ".q"), (q4, ".scale"), (q4, ".zero"),
                                        (q8, ".q"), (q8, ".scale")):  # fmt: skip
                    if base + part in arrays_of:  # rows move with their scales
                        arrays_of[base + part] = _unpermute(arrays_of[base + part], heads)
    return weights, q4, q8


# ---- config --------------------------------------------------------------------------------


def _meta(src: Path, metadata: dict[str, Any], arch: str, key: str) -> Any:
    try:
        value = metadata[f"{arch}.{key}"]
    except KeyError:
        raise ModelLoadError(f"{src}: GGUF metadata lacks {arch}.{key}") from None
    if isinstance(value, list):  # per-layer values (e.g. OpenELM); HF configs cannot say that
        raise UnsupportedModelError(f"{src}: per-layer {arch}.{key} is not supported")
    return value


def _config(
    src: Path, metadata: dict[str, Any], arch: str, weights: dict[str, np.ndarray]
) -> dict[str, Any]:
    hf_class, model_type = _ARCHS[arch]
    get = lambda key, default=None: metadata.get(f"{arch}.{key}", default)
    hidden = _meta(src, metadata, arch, "embedding_length")
    n_head = _meta(src, metadata, arch, "attention.head_count")
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
        "intermediate_size": _meta(src, metadata, arch, "feed_forward_length"),
        "num_hidden_layers": _meta(src, metadata, arch, "block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": get("attention.head_count_kv", n_head),
        "head_dim": head_dim,
        "max_position_embeddings": get("context_length", 4096),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(src, metadata, arch, weights.pop(_ROPE_FREQS, None)),
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


def _rope_scaling(
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


def _generation_config(metadata: dict[str, Any]) -> dict[str, Any]:
    ids = {k: metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "eot", "eom")}
    # Chat models often end a turn with a token other than EOS (Llama 3's <|eot_id|>).
    stops = list(dict.fromkeys(i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None))
    gen: dict[str, Any] = {"bos_token_id": ids["bos"]}
    gen["eos_token_id"] = stops[0] if len(stops) == 1 else (stops or None)
    if (pad := metadata.get("tokenizer.ggml.padding_token_id")) is not None:
        gen["pad_token_id"] = pad
    return gen


# ---- tokenizer -----------------------------------------------------------------------------

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> how text is split before BPE. "gpt2" is GPT-2's own regex; "digits"
# splits every digit first, as llama.cpp does for these (and SmolLM2's tokenizer.json does).
_BYTE_LEVEL_SPLITS = {
    "default": "gpt2",
    "gpt-2": "gpt2",
    "gpt2": "gpt2",
    "smollm": "digits",
    "starcoder": "digits",
    "refact": "digits",
    "llama3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def _write_tokenizer(src: Path, metadata: dict[str, Any], out: Path, max_len: int) -> None:
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if metadata.get("tokenizer.ggml.model") == "gpt2" and pre in _BYTE_LEVEL_SPLITS:
        _write_byte_level_tokenizer(metadata, out, _BYTE_LEVEL_SPLITS[pre], max_len)
    else:
        _write_tokenizer_via_transformers(src, metadata, out)


def _write_byte_level_tokenizer(
    metadata: dict[str, Any], out: Path, split: str, max_len: int
) -> None:
    # Built directly with `tokenizers` from the metadata we already parsed: transformers'
    # gguf_file path re-reads the whole file and takes ~3.5 s on the default model.
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    types: list[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=split is _LLAMA3_SPLIT))
    if split in ("gpt2", "digits"):  # GPT-2's regex, which ByteLevel runs itself
        steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if split == "digits":
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    else:  # the model's own regex first, then only the byte-to-unicode mapping
        steps = [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>...) and user-defined ones must match whole, never be split.
    kinds = list(zip(tokens, types, strict=False))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in kinds if k == _CONTROL]
    )
    tok.add_tokens([AddedToken(t, normalized=False) for t, k in kinds if k == _USER_DEFINED])

    def token(key: str) -> str | None:
        i = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos, eos = token("bos"), token("eos")
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        # The post-processor is what adds them, for any transformers version.
        pieces = ([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else [])
        specials = [(t, vocab[t]) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join(pieces),
            pair=" ".join(pieces + [p.replace("A:0", "B:1").replace(":0", ":1") for p in pieces]),
            special_tokens=list(dict.fromkeys(specials)),
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(out / "tokenizer.json"))

    tok_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token("unknown"),
        "pad_token": token("padding"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
    }
    if template := metadata.get("tokenizer.chat_template"):
        tok_config["chat_template"] = template
    _write_json(out / "tokenizer_config.json", tok_config)


def _write_tokenizer_via_transformers(src: Path, metadata: dict[str, Any], out: Path) -> None:
    # Slow (re-reads the file), but covers sentencepiece vocabularies (Mistral, Llama 2).
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        tok.save_pretrained(str(out))
    except Exception as e:  # transformers raises many types here; the user needs one line
        reason = " ".join(str(e).split())[:200]
        raise ModelLoadError(f"{src}: cannot build a tokenizer from this GGUF ({reason})") from e
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text(encoding="utf-8"))
    if (template := metadata.get("tokenizer.chat_template")) and not tok_config.get(
        "chat_template"
    ):
        tok_config["chat_template"] = template  # older transformers look for it here only
        _write_json(config_path, tok_config)
