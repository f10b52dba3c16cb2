"""Turn a .gguf file into a Hugging Face style checkpoint directory, cached on disk.

The engine loads HF checkpoints (config.json, model.safetensors, tokenizer files). A GGUF holds
the same model in llama.cpp's layout, so we convert it once and reuse the result. Only the
conversion needs the `gguf` package, so it is imported inside functions: machines that only
load cached checkpoints need not have it.

Quantized linear weights also keep a quantized form for the CPU's quantized kernels
(engine.loading.quant; engine.loading.gguf_quants says which type gets which). For each HF
weight `<name>`:
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

The steps have a file each: gguf_reader (header and tensor index), gguf_weights (tensors to
weights), gguf_config and gguf_tokenizer (the checkpoint's JSON files); this one caches.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.errors import ModelLoadError, ModelNotFoundError, UnsupportedModelError
from engine.loading import gguf_quants, paths
from engine.loading.gguf_config import ARCHS, checkpoint_config, generation_config, write_json
from engine.loading.gguf_parts import as_parts, open_buffer
from engine.loading.gguf_reader import read_header, unreadable
from engine.loading.gguf_tokenizer import write_tokenizer
from engine.loading.gguf_weights import read_weights

_FORMAT_VERSION = 3  # part of the cache key: bump it when the converted output changes
# written last: a directory without it is not a finished conversion
DONE_MARKER = "gguf_source.json"
_EDGE = 1 << 20  # bytes hashed from each end of the file for the cache key
_UNUSED_S = 7 * 24 * 3600  # a conversion whose source is gone goes after a week unused
_STALE_TMP_S = 24 * 3600  # temp dirs older than this are leftovers of a crashed conversion
# Not "*.safetensors": loader.load_checkpoint_weights loads every file named so.
Q4_FILE = "model.q4"
Q8_FILE = "model.q8"
Q4_GROUP = gguf_quants.GROUP  # weights per scale and zero in Q4_FILE


def gguf_to_checkpoint(
    path: str | os.PathLike | Sequence[str | os.PathLike],
    cache_root: Path | None = None,
    name: str | None = None,
) -> Path:
    """Convert `path` into an HF checkpoint directory (cached) and return that directory.

    path: a .gguf file, or the ordered part files of one split GGUF (engine.loading.gguf_parts),
    read in place. name: what the cache directory is called after (default: the file's)."""
    parts = as_parts(path)
    src = parts[0] if len(parts) == 1 else Path(f"{name or parts[0].stem} ({len(parts)} parts)")
    for part in parts:
        if not part.is_file():
            what = " (a directory, not a .gguf file)" if part.is_dir() else ""
            raise ModelNotFoundError(f"model file not found: {part}{what}")
    root = Path(cache_root) if cache_root is not None else paths.default_cache_dir() / "gguf"
    try:
        key = _cache_key(parts)
    except OSError as e:
        raise ModelLoadError(f"{src}: cannot read the file ({e.strerror or e})") from e
    stem = name or parts[0].stem
    final = root / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', stem)[:60]}-{key[:16]}"
    done = _finished(root, final, key)
    if done is not None:
        with contextlib.suppress(OSError):  # in use: see _remove_dead_conversions
            os.utime(done / DONE_MARKER)
        return done

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
        write_json(tmp / DONE_MARKER, marker)
        _publish(tmp, final)
        _remove_dead_conversions(root, final)
    except OSError as e:
        raise ModelLoadError(
            f"cannot write the converted model to {root} ({e.strerror or e})"
        ) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op once published
    return final


def _finished(root: Path, final: Path, key: str) -> Path | None:
    """The finished conversion of these bytes: `final`, else one made under another name
    (the same files reached as a catalogue model and as a path: one 2.9 GB copy, not two)."""
    if (final / DONE_MARKER).is_file():
        return final
    try:
        others = sorted(root.glob(f"*-{key[:16]}"))
    except OSError:
        return None
    for entry in others:
        try:
            marker = json.loads((entry / DONE_MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # being written, or not a conversion of ours
        if isinstance(marker, dict) and marker.get("key") == key:
            return entry
    return None


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
            marker_path = entry / DONE_MARKER
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
    if final.exists() and not (final / DONE_MARKER).is_file():
        shutil.rmtree(final, ignore_errors=True)  # not ours to trust: no completion marker
    try:
        os.replace(tmp, final)  # atomic: readers see a complete directory or none
    except OSError:
        if not (final / DONE_MARKER).is_file():
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
        raise unreadable(src, e) from e
    try:
        metadata, tensors = read_header(src, buf)
        arch = metadata.get("general.architecture")
        if arch not in ARCHS:
            raise UnsupportedModelError(
                f"{src}: unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCHS)}"
            )
        weights, q4, q8 = read_weights(src, buf, tensors, metadata, arch)
    finally:
        # BufferError: a traceback still holds a view; the map closes when that is collected.
        with contextlib.suppress(BufferError):
            buf.close()

    if not metadata.get("tokenizer.ggml.tokens"):
        raise ModelLoadError(f"{src}: GGUF has no tokenizer (tokenizer.ggml.tokens)")
    try:
        config = checkpoint_config(src, metadata, arch, weights)
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
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", generation_config(metadata))
    write_tokenizer(src, metadata, out, config["max_position_embeddings"])


def _save(tensors: dict[str, np.ndarray], path: Path, metadata: dict[str, str]) -> None:
    """safetensors' save_file, its write errors (a full disk, say) raised as OSError."""
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        raise OSError(str(e).removeprefix("Error while serializing: ")) from e
