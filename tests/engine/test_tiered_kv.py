"""Sparse decode over the tiered KV cache (engine.kv) with the real default model in exact
fp32 mode: a budget that selects every page decodes exactly as dense attention; a GPU tier
far smaller than the context (most pages only on the host, fetched when selected) decodes
exactly as an unlimited one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import Engine, EngineError, SamplingParams
from engine.config import EngineConfig
from engine.kv import SparseConfig

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
# a fixed text: what these tests measure must not move when the README is edited
README_EXCERPT = (ROOT / "tests" / "engine" / "data" / "readme_excerpt.md").read_text()
PARAMS = SamplingParams(max_tokens=40, ignore_eos=True)


def load(sparse: SparseConfig | None = None, kv_dtype: str = "auto") -> Engine:
    cfg = EngineConfig(sparse=sparse, kv_dtype=kv_dtype)
    return Engine.load(None, device="cpu", dtype="float32", weights="dense", config=cfg)


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    engine = load()
    text = README_EXCERPT[:3000]
    return engine.chat_tokens([{"role": "user", "content": text + "\nSummarise this."}])


@pytest.fixture(scope="module")
def dense_tokens(prompt) -> list[int]:
    return load().generate([prompt], PARAMS)[0].token_ids


@pytest.mark.parametrize("summary", ["quest", "mean"])
def test_a_budget_of_every_page_is_dense_attention(prompt, dense_tokens, summary):
    engine = load(SparseConfig(budget_fraction=1.0, summary=summary))
    assert engine.generate([prompt], PARAMS)[0].token_ids == dense_tokens
    stats = engine.runner.tiers.stats
    pages = -(-(len(prompt) + 40) // 16)
    assert stats.steps == 39 * 30  # every decode step of every layer went sparse
    assert 0 < stats.max_selected <= pages * 3  # pages x KV heads


@pytest.mark.parametrize("eviction", ["value", "clock"])
def test_a_tiny_gpu_tier_gives_the_same_tokens_as_a_large_one(prompt, eviction):
    sparse = dict(budget_fraction=0.25, eviction=eviction)
    large = load(SparseConfig(**sparse))
    expected = large.generate([prompt], PARAMS)[0].token_ids
    unit = 2 * 16 * 64 * 4  # one page of one head, fp32
    # 60 slots per layer: the step's ~45 selected pages fit, the context's ~190 do not
    tiny = load(SparseConfig(**sparse, gpu_kv_budget=30 * 60 * unit))
    assert tiny.runner.tiers.num_slots == 60
    assert tiny.generate([prompt], PARAMS)[0].token_ids == expected
    stats = tiny.runner.tiers.stats
    assert stats.evicted > 0 and stats.fetched > large.runner.tiers.stats.fetched
    assert 0 < stats.fetch_fraction < 1
    assert tiny.runner.tiers.resident_units() <= 30 * 60


def test_fp8_kv_in_both_tiers_decodes_like_the_models_dtype(prompt):
    """EngineConfig.kv_dtype = "fp8": the pool (host tier) and the GPU slots hold fp8 rows,
    a quarter of this fp32 model's bytes; greedy tokens follow the fp32 cache's (the first
    16 here), and a tiny GPU tier still gives exactly the tokens of a large one. The Quest
    summaries are fp8 too, and select what fp32 summaries of the same rows do."""
    from kernels.fp8 import FP8
    from kernels.page_score import empty_summaries

    sparse = dict(budget_fraction=0.25)
    exact = load(SparseConfig(**sparse)).generate([prompt], PARAMS)[0].token_ids
    fp8 = load(SparseConfig(**sparse), kv_dtype="fp8")
    tokens = fp8.generate([prompt], PARAMS)[0].token_ids
    runner = fp8.runner
    assert runner.kv.pool.dtype == runner.tiers.residency.slots.dtype == FP8
    assert runner.tiers.selection.summ.dtype == FP8
    assert tokens[:16] == exact[:16]
    wide = load(SparseConfig(**sparse), kv_dtype="fp8")
    sel = wide.runner.tiers.selection
    L, units, R, D = sel.summ.shape
    sel.summ = empty_summaries(L * units, D, mode="quest").view(L, units, R, D)  # fp32
    assert wide.generate([prompt], PARAMS)[0].token_ids == tokens
    unit = 2 * 16 * 64  # one page of one head, fp8
    tiny = load(SparseConfig(**sparse, gpu_kv_budget=30 * 60 * unit), kv_dtype="fp8")
    assert tiny.runner.tiers.num_slots == 60
    assert tiny.generate([prompt], PARAMS)[0].token_ids == tokens
    assert tiny.runner.tiers.stats.evicted > 0


def test_a_gpu_tier_smaller_than_the_working_set_is_a_clear_error(prompt):
    unit = 2 * 16 * 64 * 4
    engine = load(SparseConfig(budget_fraction=0.5, gpu_kv_budget=30 * 10 * unit))
    with pytest.raises(EngineError, match="GPU KV budget holds 10 pages per layer"):
        engine.generate([prompt], PARAMS)


def test_oracle_group_reuse_and_stochastic_tail_run_and_are_seeded(prompt):
    from bench.scorers import OracleScorer, use_scorer

    def load_with(sparse: SparseConfig, oracle: bool) -> Engine:
        engine = load(sparse)
        if oracle:
            use_scorer(engine, OracleScorer(engine.runner.tiers))
        return engine

    for sparse, oracle in (
        (SparseConfig(budget_fraction=0.1), True),
        (SparseConfig(budget_fraction=0.1, layer_group=3), False),
        (SparseConfig(budget_tokens=128, tail_pages=4, seed=3), False),
    ):
        a = load_with(sparse, oracle).generate([prompt], PARAMS)[0].token_ids
        b = load_with(sparse, oracle).generate([prompt], PARAMS)[0].token_ids
        assert a == b and len(a) == 40


def test_sparse_config_is_checked():
    with pytest.raises(ValueError, match="budget_tokens or budget_fraction"):
        SparseConfig()
    with pytest.raises(ValueError, match="budget_fraction"):
        SparseConfig(budget_fraction=1.5)
    with pytest.raises(ValueError, match="summary"):
        SparseConfig(budget_fraction=0.1, summary="median")
    assert SparseConfig(budget_tokens=100).budget_pages(1000, 16) == 7
    assert SparseConfig(budget_fraction=0.02).budget_pages(1000, 16) == 20
    assert SparseConfig(budget_fraction=0.001).budget_pages(1000, 16) == 4  # sinks+window+1


def test_skip_prefill_attention_writes_the_kv_and_decodes(prompt):
    """bench.scorers.skip_prefill_attention (benchmarks only): the prompt's KV is written as
    a normal prefill writes it where attention has not acted yet (layer 0's keys and values
    depend on the embeddings alone) and differs from the next layer on (the attention output
    was zeros), and the sequence then decodes over the tiered cache."""
    from bench.scorers import skip_prefill_attention

    sparse = SparseConfig(budget_fraction=0.2)
    out = {}
    for skip in (False, True):
        cfg = EngineConfig(sparse=sparse, enable_prefix_caching=False)
        engine = Engine.load(None, device="cpu", dtype="float32", weights="dense", config=cfg)
        if skip:
            skip_prefill_attention(engine)
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        tokens = engine.generate([prompt], params)[0].token_ids
        pool = engine.runner.kv.pool
        n_pages = len(prompt) // 16  # the prompt's full pages (allocated first, in order)
        out[skip] = (tokens, pool[:, :n_pages].clone(), engine.runner.tiers.stats)
    (_, kv, _), (tokens, kv_skip, stats) = out[False], out[True]
    assert len(tokens) == 4 and stats.steps > 0  # decoded sparse over the tiers
    assert torch.equal(kv[0], kv_skip[0])
    assert not torch.equal(kv[1], kv_skip[1])


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_a_restored_snapshot_decodes_as_the_same_context_prefilled(prompt, tmp_path, kv_dtype):
    """A snapshot's pages enter the tiers as a prefill's do (their key summaries folded, no
    stale GPU slot kept), so sparse decode after a restore selects what a cold run does. An
    fp8 cache's snapshot holds fp8 pages, which a cache of the model's dtype refuses; there
    the answer's rows, rounded, differ from a cold prefill's enough to part greedy decoding
    at a near tie, so the restore is held to the first engine continuing from its own
    cached pages instead."""
    sparse = dict(budget_fraction=0.25)

    def load(sp, kv=kv_dtype):
        return globals()["load"](sp, kv_dtype=kv)

    first = load(SparseConfig(**sparse))
    s = first.open_session("s")
    stream = s.stream(prompt, PARAMS)
    for _ in stream:
        pass
    ids = list(stream.request.seq.token_ids) + first.encode("\nNow in one line:")
    path = tmp_path / "s.kv"
    s.save(path)
    s.close()
    if kv_dtype == "fp8":
        cached = first.generate([ids], PARAMS)[0]
        assert cached.stats.cached_tokens == len(s.token_ids) // 16 * 16
        expected = cached.token_ids
    else:
        expected = load(SparseConfig(**sparse)).generate([ids], PARAMS)[0].token_ids
    second = load(SparseConfig(**sparse))
    warm = second.generate([prompt[::-1]], PARAMS)  # pages and GPU slots used before
    assert warm[0].token_ids
    t = second.open_session("t")
    assert t.restore(path) and t.restored_tokens > 0
    again = t.stream(ids, PARAMS)
    for _ in again:
        pass
    assert again.request.stats.cached_tokens == t.restored_tokens
    assert list(again.token_ids) == expected
    if kv_dtype == "fp8":
        other = load(SparseConfig(**sparse), kv="auto").open_session("u")
        assert not other.restore(path) and "KV dtype" in other.snapshot_error
