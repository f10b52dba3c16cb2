"""Real KV snapshots for the reliability tests: a tiny engine with random weights (no
tokenizer: it takes token ids), a snapshot it writes, and headers rewritten with their
checksum recomputed, as an attacker who read engine/kv/snapshot_header.py would write them."""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path
from typing import Any

from engine import Engine, EngineConfig, SamplingParams
from engine.kv.snapshot_header import header_crc

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
PROMPT = list(range(1, 40))  # 39 tokens: with the answer, two whole pages of 16


def tiny_engine(directory: Path) -> Engine:
    config = directory / "config.json"
    config.write_text(json.dumps(TINY))
    return Engine.load(
        f"dummy:{config}", device="cpu", dtype="float32", config=EngineConfig(num_pages=64)
    )


def write_snapshot(engine: Engine, path: Path) -> list[int]:
    """A real snapshot of one turn; returns the token ids it holds."""
    s = engine.open_session(f"writer-{path.name}")
    stream = s.stream(PROMPT, SamplingParams(max_tokens=8))
    for _ in stream:
        pass
    meta = s.save(path)
    tokens = s.token_ids[: int(meta["num_tokens"])]
    s.close()
    engine.block_manager.reset_prefix_cache()
    return tokens


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(the header's JSON, the data after it) of a snapshot file's bytes."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def join(header: Any, body: bytes, recompute_crc: bool = True) -> bytes:
    """A snapshot file of `header` (any JSON value) and `body`, its header checksum
    recomputed when the metadata is an object whose values it can hash."""
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if recompute_crc and isinstance(meta, dict):
        with contextlib.suppress(TypeError, ValueError):  # (values json cannot write)
            meta["header_crc32"] = header_crc(meta)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


def loads_or_refuses(engine: Engine, path: Path) -> str | None:
    """Open a session from the snapshot at `path` as `ask -c` does: None when it was
    restored, else the one-line reason it was refused. The pages go back either way."""
    free = engine.block_manager.num_free_blocks
    s = engine.open_session(f"reader-{path.name}", snapshot=str(path))
    error = s.snapshot_error
    s.close()
    engine.block_manager.reset_prefix_cache()
    assert engine.block_manager.num_free_blocks == free
    if error is not None:
        assert "\n" not in error and error.strip(), repr(error)
    return error
