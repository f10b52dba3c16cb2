"""KV reuse across turns and restarts (engine.kv.session, engine.kv.snapshot), with the real
default model in exact fp32 mode: turn 2 prefills only its new tokens and answers exactly
as a cold run over the same prompt; snapshots restore that in another process; mismatched
or damaged snapshots are refused and the engine prefills instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import Engine, SamplingParams
from engine.config import EngineConfig
from engine.kv.snapshot import SnapshotError, load_snapshot, read_header

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
# a fixed text: what these tests measure must not move when the README is edited
README_EXCERPT = (ROOT / "tests" / "engine" / "data" / "readme_excerpt.md").read_text()
GREEDY = SamplingParams(max_tokens=24)
CONTEXT = README_EXCERPT[:3000]
FIRST = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": f"{CONTEXT}\n\nWhat is agentctx?"},
]
FOLLOW_UP = {"role": "user", "content": "How do I run its tests?"}


def load(**config) -> Engine:
    cfg = EngineConfig(**config) if config else None
    return Engine.load(None, device="cpu", dtype="float32", weights="dense", config=cfg)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load()


def run(stream) -> list[int]:
    for _ in stream:
        pass
    return list(stream.token_ids)


def two_turns(engine: Engine, sid: str):
    """Turn 1, then turn 2 in one live session; returns (session, turn-2 stream)."""
    s = engine.open_session(sid)
    first = s.append(FIRST, GREEDY)
    run(first)
    s.messages.append({"role": "assistant", "content": first.text})
    second = s.append([FOLLOW_UP], GREEDY)
    run(second)
    return s, first, second


_cold: list[Engine] = []


def cold(engine: Engine, ids: list[int]) -> list[int]:
    """The greedy answer of a full prefill, on an engine with no prefix cache."""
    if not _cold:
        _cold.append(load(enable_prefix_caching=False))
    out = _cold[0].generate([ids], GREEDY)[0]
    assert out.stats.cached_tokens == 0
    return out.token_ids


def prompt_of(stream) -> list[int]:
    seq = stream.request.seq
    return seq.token_ids[: seq.num_prompt_tokens]


def test_turn_two_prefills_only_new_tokens_and_matches_a_cold_run(engine):
    free = engine.block_manager.num_free_blocks
    s, first, second = two_turns(engine, "t2")
    turn1 = first.request.seq
    reuse = s.last_reuse
    # the whole of turn 1, answer included, is a prefix of turn 2's prompt
    assert not reuse.diverged and reuse.common_tokens == len(turn1.token_ids)
    assert reuse.reused_tokens == len(turn1.token_ids) // 16 * 16 > turn1.num_prompt_tokens
    stats = second.request.stats
    assert stats.cached_tokens == reuse.reused_tokens
    new_tokens = stats.prompt_tokens - len(turn1.token_ids)
    assert stats.prefill_tokens == reuse.prefilled_tokens < new_tokens + 16
    assert second.token_ids == cold(engine, prompt_of(second))
    s.close()
    engine.block_manager.reset_prefix_cache()
    assert engine.block_manager.num_free_blocks == free  # every pin released


def test_divergent_rerendering_is_detected_and_reported(engine):
    s = engine.open_session("div")
    first = s.append(FIRST, GREEDY)
    run(first)
    # as a template that strips reasoning would: the answer comes back changed
    s.messages.append({"role": "assistant", "content": "(edited) " + first.text})
    second = s.append([FOLLOW_UP], GREEDY)
    run(second)
    reuse = s.last_reuse
    assert reuse.diverged and reuse.common_tokens < len(first.request.seq.token_ids)
    assert reuse.reused_tokens == reuse.common_tokens // 16 * 16
    assert second.request.stats.cached_tokens == reuse.reused_tokens
    assert second.token_ids == cold(engine, prompt_of(second))
    s.close()


def test_eviction_keeps_a_live_sessions_pages():
    engine = load(num_pages=160)  # 2,560 tokens: other traffic must evict
    s = engine.open_session("pinned")
    first = s.append(FIRST, GREEDY)
    run(first)
    pinned = list(s.blocks)
    other = [{"role": "user", "content": "Count: " + "one two three " * 200}]
    ids = engine.chat_tokens(other)
    engine.generate([ids], SamplingParams(max_tokens=2))
    for i in range(6):  # distinct prompts, each most of the free pages
        engine.generate([engine.chat_tokens([{"role": "user", "content": f"{i} " * 700}])],
                        SamplingParams(max_tokens=2))  # fmt: skip
    # a prompt without a session lost its pages (all but the default system prompt's
    # first page, which every filler prompt shares and so keeps fresh)...
    assert engine.generate([ids], SamplingParams(max_tokens=2))[0].stats.cached_tokens <= 16
    # ...the session kept every one of its own
    assert s.blocks == pinned
    s.messages.append({"role": "assistant", "content": first.text})
    second = s.append([FOLLOW_UP], GREEDY)
    run(second)
    assert second.request.stats.cached_tokens == len(first.request.seq.token_ids) // 16 * 16
    s.close()


def test_two_sessions_with_one_prefix_share_its_pages(engine):
    a, b = engine.open_session("share-a"), engine.open_session("share-b")
    ra = a.append(FIRST, GREEDY)
    run(ra)
    rb = b.append(FIRST, GREEDY)  # the same repository packed the same way
    run(rb)
    prompt_pages = len(prompt_of(ra)) // 16
    assert rb.request.stats.cached_tokens == prompt_pages * 16
    assert b.blocks[:prompt_pages] == a.blocks[:prompt_pages]  # the same pages, not copies
    assert all(engine.block_manager.pool.blocks[x].ref_count == 2 for x in a.blocks[:prompt_pages])
    assert rb.token_ids == ra.token_ids
    a.close()
    b.close()


# -- snapshots ----------------------------------------------------------------------------

RESTART = """
import json, sys
from engine import Engine, SamplingParams
engine = Engine.load(None, device="cpu", dtype="float32", weights="dense")
ids, path = json.loads(sys.argv[1]), sys.argv[2]
s = engine.open_session("resumed", snapshot=path)
stream = s.stream(ids, SamplingParams(max_tokens=24))
for _ in stream:
    pass
print(json.dumps({"restored": s.restored_tokens, "error": s.snapshot_error,
                  "cached": stream.request.stats.cached_tokens, "tokens": stream.token_ids}))
"""


@pytest.fixture(scope="module")
def saved(engine, tmp_path_factory):
    """A snapshot of turn 1, and turn 2's prompt and its cold greedy answer."""
    s = engine.open_session("snap")
    first = s.append(FIRST, GREEDY)
    run(first)
    path = tmp_path_factory.mktemp("kv") / "snap.kv"
    meta = s.save(path)
    s.messages.append({"role": "assistant", "content": first.text})
    prompt = engine.chat_tokens(s.messages + [FOLLOW_UP])
    s.close()
    return path, meta, prompt, cold(engine, prompt), len(first.request.seq.token_ids)


def restart(path, prompt) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", RESTART, json.dumps(prompt), str(path)],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_snapshot_restores_in_a_new_process_without_prefill(saved):
    path, meta, prompt, expected, turn1_len = saved
    header, _ = read_header(path)
    assert header["kv"]["dtype"] == "F32" and int(meta["num_tokens"]) == turn1_len // 16 * 16
    got = restart(path, prompt)
    assert got["error"] is None and got["restored"] == turn1_len // 16 * 16
    assert got["cached"] == got["restored"]  # only the tokens after them were prefilled
    assert got["tokens"] == expected


def damaged(path: Path, tmp_path: Path, how: str) -> Path:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: len(data) - 1000]
    elif how == "flipped data byte":
        data[len(data) // 2] ^= 0x01
    elif how == "flipped header byte":
        n = int.from_bytes(data[:8], "little")
        i = bytes(data[8 : 8 + n]).index(b'"num_tokens":"') + len('"num_tokens":"')
        data[8 + i] = ord("9") if data[8 + i] != ord("9") else ord("8")
    elif how == "not a snapshot":
        data = b"hello"
    out = tmp_path / f"{how.replace(' ', '-')}.kv"
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("how,message", [
    ("truncated", "truncated"),
    ("flipped data byte", "checksum mismatch in chunk"),
    ("flipped header byte", "header checksum mismatch"),
    ("not a snapshot", "truncated"),
])  # fmt: skip
def test_damaged_snapshots_are_refused_and_the_engine_prefills(
    engine, saved, tmp_path, how, message
):
    path, _, prompt, expected, _ = saved
    bad = damaged(path, tmp_path, how)
    free = engine.block_manager.num_free_blocks
    with pytest.raises(SnapshotError, match=message):
        load_snapshot(engine, bad)
    assert engine.block_manager.num_free_blocks == free  # the pages it took went back
    engine.block_manager.reset_prefix_cache()
    s = engine.open_session(f"bad-{how}", snapshot=bad)
    assert message in s.snapshot_error and s.restored_tokens == 0
    stream = s.stream(prompt, GREEDY)
    assert run(stream) == expected and stream.request.stats.cached_tokens == 0
    s.close()


@pytest.mark.parametrize("other", ["another model", "another page size", "a RoPE scaling"])
def test_mismatched_snapshots_are_refused(saved, other):
    path, _, prompt, _, _ = saved
    if other == "another model":
        engine = Engine.load("dummy:smollm2-135m", device="cpu", dtype="float32")
        message = "other model weights"
    elif other == "a RoPE scaling":  # the same weights rotate every key otherwise
        engine = load(rope_scaling={"rope_type": "yarn", "factor": 2.0})
        message = "KV mode"
    else:
        engine = load(page_size=32)
        message = "page size 16 here is 32"
    s = engine.open_session("x", snapshot=path)
    assert message in s.snapshot_error and s.token_ids == [] and s.blocks == []
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    if engine.tokenizer is not None:  # falls back to a normal prefill
        stream = s.stream(prompt, GREEDY)
        run(stream)
        assert stream.request.stats.cached_tokens == 0 and stream.token_ids


def test_snapshot_file_is_valid_safetensors(saved):
    from safetensors import safe_open

    path, meta, _, _, turn1_len = saved
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata()["weights_hash"] == meta["weights_hash"]
        assert f.get_tensor("token_ids").shape[0] == turn1_len // 16 * 16
    assert os.path.getsize(path) > 0
