"""KV snapshot files: a session's pages and tokens on disk, restored without any prefill.

The file is a valid safetensors file (8-byte little-endian header length, a JSON header,
then the raw data), so standard tools can read it:
- `kv`: [pages, layers, kv_heads, 2, page_size, head_dim] in the pool's dtype, page i
  holding tokens [i * page_size, (i + 1) * page_size);
- `token_ids`: int64 [pages * page_size];
- `__metadata__`: the engine identity the KV depends on (layout version, a fingerprint of
  the weights and of the tokenizer, the weights mode, page size, dtype, shapes), the token
  count, and a CRC-32 for every 64 MiB chunk of the data plus one for the header itself.

Loading memory-maps the file and copies it page-chunk by page-chunk into freshly taken
pool pages while the chunk checksums are verified on worker threads; nothing is handed to
the prefix cache until every check passed. Any mismatch (another model, page size, dtype or
layout) or damage (truncation, a flipped byte) raises SnapshotError with one clear line,
and the taken pages go back to the free list: mismatched KV is never used.

Writing streams the pages out chunk by chunk (no whole copy in memory), into a temporary
file that replaces the target only when complete. The header is read and checked, field by
field, in engine.kv.snapshot_header, which also removes the temporary files of killed writers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from engine.kv.snapshot_header import (
    FORMAT,
    LAYOUT_VERSION,
    SnapshotError,
    header_crc,
    open_regular,
    read_header_from,
    remove_stale_temps,
    shown,
    temp_path,
)

__all__ = ["SnapshotError", "load_snapshot", "read_header", "save_snapshot"]

CHUNK_BYTES = 64 << 20  # the checksum unit
_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
           torch.float8_e4m3fn: "F8_E4M3"}  # fmt: skip
_BY_NAME = {v: k for k, v in _DTYPES.items()}
# identity keys a snapshot must match, with what a mismatch means to a user
_MUST_MATCH = {
    "layout_version": "layout version",
    "weights_hash": "model weights",
    "tokenizer_hash": "tokenizer",
    "kv_mode": "KV mode (weights mode / prefill precision)",
    "page_size": "page size",
    "dtype": "KV dtype",
    "num_layers": "layer count",
    "num_kv_heads": "KV head count",
    "head_dim": "head dim",
}


# -- identity ------------------------------------------------------------------------------


def weights_fingerprint(model: torch.nn.Module, samples: int = 1024) -> str:
    """A hash of every parameter's and buffer's name, shape, dtype and `samples` values
    spread evenly over it: distinct weights give distinct hashes at a cost of milliseconds,
    where hashing every byte of an 8B model would take seconds."""
    h = hashlib.blake2b(digest_size=16)
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    for name, t in sorted(tensors, key=lambda kv: kv[0]):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        if t.numel() == 0 or t.device.type == "meta":
            continue
        flat = t.detach().reshape(-1)
        k = min(samples, flat.numel())
        idx = torch.arange(k, device=flat.device) * (flat.numel() - 1) // max(k - 1, 1)
        picked = flat[idx]
        if picked.is_floating_point():
            picked = picked.float()
        h.update(picked.cpu().numpy().tobytes())
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    if tokenizer is None:
        return "none"
    h = hashlib.blake2b(digest_size=16)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update((getattr(tokenizer, "chat_template", None) or "").encode())
    return h.hexdigest()


def engine_identity(engine) -> dict[str, str]:
    cfg = engine.model_config
    prefill = getattr(engine.runner, "prefill_attn_dtype", None)
    return {
        "format": FORMAT,
        "layout_version": LAYOUT_VERSION,
        "model": engine.name,
        "weights_hash": weights_fingerprint(engine.model),
        "tokenizer_hash": tokenizer_fingerprint(engine.tokenizer),
        "kv_mode": f"{engine.weights_mode}/{prefill or 'native'}{_rope_tag(engine)}".replace(
            "torch.", ""
        ),
        "page_size": str(engine.config.page_size),
        "dtype": _DTYPES[engine.runner.kv.pool.dtype],  # (the pool's: fp8 or the model's)
        "num_layers": str(cfg.num_layers),
        "num_kv_heads": str(cfg.num_kv_heads),
        "head_dim": str(cfg.head_dim),
    }


def _rope_tag(engine) -> str:
    """A RoPE scaling the engine was asked for (EngineConfig.rope_scaling) rotates every key
    otherwise: its KV is not the model's plain KV."""
    rope = engine.config.rope_scaling
    return "" if rope is None else f"/rope:{rope['rope_type']}x{rope['factor']:g}"


# -- writing -------------------------------------------------------------------------------


def _header(meta: dict[str, str], kv_shape, dtype: str, kv_bytes: int, n_tokens: int) -> bytes:
    body = {
        "__metadata__": meta,
        "kv": {"dtype": dtype, "shape": list(kv_shape), "data_offsets": [0, kv_bytes]},
        "token_ids": {
            "dtype": "I64",
            "shape": [n_tokens],
            "data_offsets": [kv_bytes, kv_bytes + 8 * n_tokens],
        },
    }
    raw = json.dumps(body, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # the data starts 8-byte aligned


def save_snapshot(engine, path, blocks: list[int], token_ids: list[int]) -> dict:
    """Write pages `blocks` (holding token_ids, whole pages) to `path`. Returns the
    metadata written."""
    P = engine.config.page_size
    assert len(token_ids) == len(blocks) * P, "a snapshot holds whole pages"
    pool = engine.runner.kv.pool  # [L, pages, Hkv, 2, P, D]
    page_shape = (pool.shape[0],) + tuple(pool.shape[2:])
    page_bytes = pool[:, 0].numel() * pool.element_size()
    kv_bytes = page_bytes * len(blocks)
    data_bytes = kv_bytes + 8 * len(token_ids)
    n_chunks = -(-data_bytes // CHUNK_BYTES)
    meta = dict(engine.kv_identity())
    meta.update(
        num_tokens=str(len(token_ids)),
        chunk_bytes=str(CHUNK_BYTES),
        # fixed-width placeholders: the header is rewritten in place once the data is out
        chunk_crc32=",".join(["00000000"] * n_chunks),
        header_crc32="00000000",
    )
    shape = (len(blocks), *page_shape)
    dtype = meta["dtype"]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent, path.name)  # left by a writer that was killed
    tmp = temp_path(path)
    crcs = _ChunkCrc(CHUNK_BYTES)
    try:
        with open(tmp, "wb") as f:
            header = _header(meta, shape, dtype, kv_bytes, len(token_ids))
            f.write(struct.pack("<Q", len(header)) + header)
            per = max(1, (16 << 20) // page_bytes)  # pages per copy: ~16 MiB
            ids = torch.tensor(blocks, dtype=torch.long, device=pool.device)
            for start in range(0, len(blocks), per):
                chunk = pool.index_select(1, ids[start : start + per]).transpose(0, 1)
                data = chunk.contiguous().cpu().view(torch.uint8).numpy()
                f.write(data)
                crcs.update(memoryview(data).cast("B"))
            tok = torch.tensor(token_ids, dtype=torch.int64).numpy().tobytes()
            f.write(tok)
            crcs.update(tok)
            meta["chunk_crc32"] = ",".join(crcs.finish())
            meta["header_crc32"] = header_crc(meta)
            final = _header(meta, shape, dtype, kv_bytes, len(token_ids))
            assert len(final) == len(header)
            f.seek(8)
            f.write(final)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return meta


class _ChunkCrc:
    """CRC-32 of consecutive fixed-size chunks of a byte stream fed in arbitrary pieces."""

    def __init__(self, chunk: int) -> None:
        self.chunk, self.filled, self.crc, self.out = chunk, 0, 0, []

    def update(self, data) -> None:
        view = memoryview(data)
        while len(view):
            take = min(len(view), self.chunk - self.filled)
            self.crc = zlib.crc32(view[:take], self.crc)
            self.filled += take
            view = view[take:]
            if self.filled == self.chunk:
                self.out.append(f"{self.crc:08x}")
                self.crc, self.filled = 0, 0

    def finish(self) -> list[str]:
        if self.filled:
            self.out.append(f"{self.crc:08x}")
            self.crc, self.filled = 0, 0
        return self.out


# -- reading -------------------------------------------------------------------------------


def read_header(path) -> tuple[dict, int]:
    """The parsed header and the data's offset; SnapshotError for anything malformed."""
    path = Path(path)
    with open_regular(path) as f:
        header = read_header_from(f, path.name)
    return header.raw, header.offset


def check_identity(meta: dict, engine, name: str = "snapshot") -> None:
    mine = engine.kv_identity()
    for key, what in _MUST_MATCH.items():
        if meta.get(key) != mine[key]:
            if key == "weights_hash":
                raise SnapshotError(
                    f"{name} was made with other model weights ({shown(meta.get('model'))}), "
                    f"not those of {mine['model']}"
                )
            raise SnapshotError(
                f"{name} does not match this engine: {what} {shown(meta.get(key))} here is "
                f"{mine[key]}"
            )


def load_snapshot(engine, path) -> tuple[list[int], list[bytes], list[int]]:
    """Restore a snapshot into fresh pages, pinned for the caller: returns (pages, chain
    hashes, token ids). SnapshotError if it does not match or is damaged. The file is
    opened once (a regular file only) and mapped from that descriptor."""
    path = Path(path)
    remove_stale_temps(path.parent, path.name)  # left by a writer that was killed
    with open_regular(path) as f:
        header = read_header_from(f, path.name)
        check_identity(header.meta, engine, path.name)
        pool = engine.runner.kv.pool
        P = engine.config.page_size
        n_pages = header.num_tokens // P
        shape = (n_pages, pool.shape[0], *pool.shape[2:])
        page_bytes = pool[:, 0].numel() * pool.element_size()
        if (
            header.kv_shape != shape
            or header.num_tokens % P
            or header.kv_end != n_pages * page_bytes
        ):
            raise SnapshotError(f"{path.name} has a malformed header (shapes do not agree)")
        size = os.fstat(f.fileno()).st_size
        if size != header.offset + header.tok_end:
            raise SnapshotError(
                f"{path.name} is truncated or padded: {size} bytes, "
                f"{header.offset + header.tok_end} expected"
            )
        bm = engine.block_manager
        if n_pages > bm.num_free_blocks:
            raise SnapshotError(
                f"{path.name} needs {n_pages} free KV pages, the cache has {bm.num_free_blocks}"
            )
        try:  # a private (copy-on-write) map: writable for torch.frombuffer, never written
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError) as e:
            raise SnapshotError(f"cannot map {path.name}: {e}") from None
    h = header
    try:
        with engine._lock:
            blocks = bm.take(n_pages)
            try:
                tokens = _copy_in(mm, h, shape, pool, blocks, path)
            except BaseException:
                bm.release(blocks)
                raise
            hashes = bm.register(blocks, tokens)
    finally:
        with contextlib.suppress(BufferError):  # a traceback holds a view: the GC closes it
            mm.close()
    return blocks, hashes, tokens


def _copy_in(mm, header, shape, pool, blocks, path) -> list[int]:
    """Copy the mapped pages into `blocks` while worker threads check the chunk CRCs of
    the data `header` (engine.kv.snapshot_header) describes."""
    offset, data_end = header.offset, header.tok_end
    chunk, crcs = header.chunk_bytes, header.chunk_crcs
    view = memoryview(mm)
    try:

        def crc(i: int) -> bool:
            lo = offset + i * chunk
            return f"{zlib.crc32(view[lo : min(lo + chunk, offset + data_end)]):08x}" == crcs[i]

        workers = min(8, os.cpu_count() or 1, max(1, len(crcs)))
        with ThreadPoolExecutor(workers) as pool_ex:
            checks = pool_ex.map(crc, range(len(crcs)))
            n_pages = shape[0]
            elems = 1
            for d in shape:
                elems *= d
            if pool.dtype == torch.float8_e4m3fn:  # (copied as its bytes: no fp8 index_copy_)
                pool = pool.view(torch.uint8)
            dtype = pool.dtype
            if n_pages:
                kv = torch.frombuffer(mm, dtype=dtype, count=elems, offset=offset).view(shape)
                ids = torch.tensor(blocks, dtype=torch.long, device=pool.device)
                per = max(1, (64 << 20) // (kv[0].numel() * kv.element_size()))
                for start in range(0, n_pages, per):
                    part = kv[start : start + per].to(pool.device, non_blocking=False)
                    pool.index_copy_(1, ids[start : start + per], part.transpose(0, 1))
                del kv, part
            n_tokens = shape[0] * pool.shape[-2]
            tok_off = offset + data_end - 8 * n_tokens
            tokens = []
            if n_tokens:
                t = torch.frombuffer(mm, dtype=torch.int64, count=n_tokens, offset=tok_off)
                tokens = t.tolist()
                del t
            bad = [i for i, good in enumerate(checks) if not good]
        if bad:
            raise SnapshotError(f"{path.name} is corrupted (checksum mismatch in chunk {bad[0]})")
        if pool.device.type == "cuda":
            torch.cuda.synchronize(pool.device)
        return tokens
    finally:
        view.release()
