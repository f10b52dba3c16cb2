"""The header of a KV snapshot file, read and checked field by field, and the temporary
files a write leaves behind.

A snapshot may come from anywhere (`sessions import` writes the bytes of another
machine's file), so its header is read as hostile input: only a regular file is opened (a
FIFO would block forever, a device never ends), and every field must have its type and a
value in range before anything is computed from it. What fails says so in one line
(SnapshotError); no header reaches arithmetic unchecked (a chunk_bytes of "0" once
divided by zero).

A snapshot is written to `.<name>.<pid>.tmp` beside its target and moved into place when
complete. A process killed mid-write leaves its temporary file; once its pid is gone the
file is stale and is removed (`remove_stale_temps`).
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from engine.errors import EngineError

FORMAT = "agentctx-kv-snapshot"
LAYOUT_VERSION = "1"
MAX_HEADER = 1 << 20
DTYPE_NAMES = ("F32", "BF16", "F16", "F8_E4M3")
# the metadata's integer fields, as decimal strings, with their least value
_COUNTS = {
    "page_size": 1,
    "num_layers": 1,
    "num_kv_heads": 1,
    "head_dim": 1,
    "num_tokens": 0,
    "chunk_bytes": 1,
}
_TEXTS = ("format", "layout_version", "model", "weights_hash", "tokenizer_hash", "kv_mode")
METADATA_KEYS = frozenset(_TEXTS + tuple(_COUNTS) + ("dtype", "chunk_crc32", "header_crc32"))
_MAX_COUNT = 1 << 40  # no snapshot holds a tebibyte of tokens or a chunk larger than that
_DECIMAL = re.compile(r"[0-9]{1,15}")  # (ASCII digits only: int() also takes "١٢" and " 1_0")
_CRC = re.compile(r"[0-9a-f]{8}")
_TEMP = re.compile(r"\.(?P<target>.+)\.(?P<pid>[0-9]{1,20})\.tmp")


class SnapshotError(EngineError):
    """A snapshot that cannot be used here; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class Header:
    """A checked header: the metadata (every value a string) and the numbers in it."""

    raw: dict[str, Any]  # the JSON as read
    meta: dict[str, str]
    offset: int  # where the data starts
    num_tokens: int
    chunk_bytes: int
    chunk_crcs: list[str]
    kv_shape: tuple[int, ...]
    kv_end: int  # the KV's bytes, then the token ids up to tok_end
    tok_end: int


def shown(value: Any, limit: int = 40) -> str:
    """A value from the file for a message, on one line whatever it holds: a plain string
    as it is, anything else as ascii() writes it; cut at `limit` characters."""
    plain = isinstance(value, str) and value.isascii() and value.isprintable()
    text = value if plain else ascii(value)
    return text if len(text) <= limit else text[:limit] + "..."


def header_crc(meta: dict[str, Any]) -> str:
    rest = {k: v for k, v in meta.items() if k != "header_crc32"}
    return f"{zlib.crc32(json.dumps(rest, sort_keys=True).encode()):08x}"


def open_regular(path: Path) -> IO[bytes]:
    """The file at `path` opened for reading, if it is a regular file. O_NONBLOCK: opening a
    FIFO with no writer would otherwise block forever; what was opened is checked with
    fstat, so a FIFO, device or folder swapped in is refused too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise SnapshotError(f"no snapshot at {path}") from None
    except OSError as e:
        raise SnapshotError(f"cannot open {path.name}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotError(f"{path.name} is not a regular file")
        os.set_blocking(fd, True)
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_header_from(f: IO[bytes], name: str) -> Header:
    """The checked header of the open snapshot `f`; SnapshotError for anything malformed."""
    try:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise SnapshotError(f"{name} is truncated (no header)")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER, size - 8):
            raise SnapshotError(f"{name} is truncated or not a KV snapshot")
        header = json.loads(f.read(n))
    except (OSError, ValueError, RecursionError) as e:  # (UnicodeDecodeError: a ValueError)
        raise SnapshotError(f"{name} is not a readable KV snapshot ({shown(str(e), 80)})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise SnapshotError(f"{name} is not an agentctx KV snapshot")
    _check_metadata(meta, name)
    if meta["header_crc32"] != header_crc(meta):
        raise SnapshotError(f"{name} is corrupted (header checksum mismatch)")
    return _check_layout(header, meta, 8 + n, name)


def _check_metadata(meta: dict[str, Any], name: str) -> None:
    """Every key known and present, every value a string of its field's form."""
    unknown = sorted(set(meta) - METADATA_KEYS)
    if unknown:
        raise SnapshotError(f"{name} has a malformed header (unknown field {shown(unknown[0])})")
    for key in sorted(METADATA_KEYS):
        if key not in meta:
            raise SnapshotError(f"{name} has a malformed header ({key} is missing)")
        if not isinstance(meta[key], str):
            raise SnapshotError(
                f"{name} has a malformed header ({key} is {shown(meta[key])}, not a string)"
            )
    for key, least in _COUNTS.items():
        value = meta[key]
        if not _DECIMAL.fullmatch(value) or not least <= int(value) <= _MAX_COUNT:
            raise SnapshotError(
                f"{name} has a malformed header ({key} is {shown(value)}, not an integer "
                f"from {least} to {_MAX_COUNT})"
            )
    if meta["dtype"] not in DTYPE_NAMES:
        raise SnapshotError(f"{name} has a malformed header (dtype {shown(meta['dtype'])})")
    crcs = meta["chunk_crc32"].split(",") if meta["chunk_crc32"] else []
    for crc in [*crcs, meta["header_crc32"]]:
        if not _CRC.fullmatch(crc):
            raise SnapshotError(f"{name} has a malformed header (checksum {shown(crc)})")


def _check_layout(header: dict[str, Any], meta: dict[str, str], offset: int, name: str) -> Header:
    """The two tensors' entries: nothing else in the file, each of the form the writer
    writes, the token ids right after the KV, one checksum per chunk of the data."""
    if set(header) != {"__metadata__", "kv", "token_ids"}:
        extra = sorted(set(header) - {"__metadata__"} - {"kv", "token_ids"})
        what = f"unknown tensor {shown(extra[0])}" if extra else "a tensor is missing"
        raise SnapshotError(f"{name} has a malformed header ({what})")
    kv = _tensor(header["kv"], "kv", meta["dtype"], 6, name)
    tok = _tensor(header["token_ids"], "token_ids", "I64", 1, name)
    n_tokens, chunk = int(meta["num_tokens"]), int(meta["chunk_bytes"])
    kv_start, kv_end = kv["data_offsets"]
    tok_start, tok_end = tok["data_offsets"]
    if kv_start != 0 or tok_start != kv_end or tok["shape"] != [n_tokens]:
        raise SnapshotError(f"{name} has a malformed header (tensor offsets do not agree)")
    if tok_end != kv_end + 8 * n_tokens:
        raise SnapshotError(f"{name} has a malformed header (token_ids is not {n_tokens} ids)")
    crcs = meta["chunk_crc32"].split(",") if meta["chunk_crc32"] else []
    if len(crcs) != -(-tok_end // chunk):
        raise SnapshotError(f"{name} has a malformed header (checksum count)")
    return Header(
        header, dict(meta), offset, n_tokens, chunk, crcs, tuple(kv["shape"]), kv_end, tok_end
    )


def _tensor(entry: Any, key: str, dtype: str, rank: int, name: str) -> dict[str, Any]:
    bad = f"{name} has a malformed header ({key}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise SnapshotError(f"{bad} is not a tensor entry)")
    if entry["dtype"] != dtype:
        raise SnapshotError(f"{bad} dtype is {shown(entry['dtype'])}, not {dtype})")
    for field, length in (("shape", rank), ("data_offsets", 2)):
        value = entry[field]
        if (
            not isinstance(value, list)
            or len(value) != length
            or not all(_natural(v) for v in value)
        ):
            raise SnapshotError(f"{bad} {field} is {shown(value)})")
    lo, hi = entry["data_offsets"]
    if lo > hi:
        raise SnapshotError(f"{bad} data_offsets {lo} > {hi})")
    return entry


def _natural(value: Any) -> bool:
    """An int from 0 to 2**62 (JSON's true is an int to Python, never to us)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 62


# -- temporary files -----------------------------------------------------------------------


def temp_path(path: Path) -> Path:
    """Where this process writes `path` before moving it into place."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def temp_files(directory: Path, target: str | None = None) -> list[tuple[Path, int]]:
    """(file, pid) of every temporary file in `directory` (of `target` only, if given)."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for entry in names:
        m = _TEMP.fullmatch(entry)
        if m and (target is None or m["target"] == target):
            found.append((directory / entry, int(m["pid"])))
    return found


def pid_alive(pid: int) -> bool:
    if pid <= 0:  # (os.kill(0, 0) would ask about our own process group)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OSError, OverflowError):
        return False
    return True


def remove_stale_temps(directory: Path, target: str | None = None) -> list[Path]:
    """Remove the temporary files whose writer is gone; returns them."""
    removed = []
    for path, pid in temp_files(directory, target):
        if pid != os.getpid() and not pid_alive(pid):
            try:
                if stat.S_ISREG(path.lstat().st_mode):
                    path.unlink()
                    removed.append(path)
            except OSError:
                continue
    return removed
