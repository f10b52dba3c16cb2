"""GGUF header reading: the metadata and the tensor index, checked against the file's size.

Our own parser rather than gguf.GGUFReader: the reader builds a numpy memmap view per string
and takes ~1.6 s on the default model's 100k vocabulary strings; this takes ~0.1 s.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ModelLoadError, UnsupportedModelError

# GGUF metadata value types with a fixed size (8 is string, 9 is array).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}
_F32 = 6


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy/HF order; ggml lists dimensions fastest-moving first
    qtype: int  # ggml type id
    start: int  # absolute byte offset in the file
    nbytes: int


def unreadable(src: Path, why: object) -> ModelLoadError:
    reason = " ".join(str(why).split())[:120] or type(why).__name__
    return ModelLoadError(f"{src}: not a readable GGUF file ({reason})")


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


def read_header(src: Path, buf: mmap.mmap) -> tuple[dict[str, Any], list[TensorInfo]]:
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
            tensors.append(TensorInfo(name, shape, qtype, start, nbytes))
    except (ValueError, struct.error, OverflowError, MemoryError, TypeError) as e:
        raise unreadable(src, e) from e
    return metadata, tensors


def raw(buf: mmap.mmap, t: TensorInfo) -> np.ndarray:
    """The tensor's bytes, in place in the mapped file."""
    return np.frombuffer(buf, np.uint8, t.nbytes, t.start)


def meta(src: Path, metadata: dict[str, Any], arch: str, key: str) -> Any:
    """The architecture's metadata value `key`, which the file must have, as one value."""
    try:
        value = metadata[f"{arch}.{key}"]
    except KeyError:
        raise ModelLoadError(f"{src}: GGUF metadata lacks {arch}.{key}") from None
    if isinstance(value, list):  # per-layer values (e.g. OpenELM); HF configs cannot say that
        raise UnsupportedModelError(f"{src}: per-layer {arch}.{key} is not supported")
    return value
