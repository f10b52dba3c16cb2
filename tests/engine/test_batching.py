"""Continuous batching gives each sequence the tokens it gets alone."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from engine import SamplingParams
from tests.engine.conftest import load_engine, tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
    )  # fmt: skip
    return tiny_checkpoint(tmp_path_factory, "batching", cfg)


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 300, (n,), generator=g).tolist() for n in (5, 37, 16, 70)]


def test_batched_equals_alone(checkpoint):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    alone = [load_engine(checkpoint).generate([p], params)[0].token_ids for p in prompts()]
    # a small token budget forces chunked prefill mixed with decodes of the other sequences
    engine = load_engine(checkpoint, max_num_batched_tokens=24, page_size=8)
    together = [c.token_ids for c in engine.generate(prompts(), params)]
    assert together == alone


def test_seeded_sampling_is_reproducible(checkpoint):
    engine = load_engine(checkpoint)
    params = SamplingParams(
        max_tokens=16, temperature=0.9, top_p=0.9, top_k=50, seed=7, ignore_eos=True
    )
    a = engine.generate([prompts()[1]], params)[0].token_ids
    b = engine.generate([prompts()[1]], params)[0].token_ids
    c = engine.generate(
        [prompts()[1]], SamplingParams(max_tokens=16, temperature=0.9, seed=8, ignore_eos=True)
    )
    assert a == b
    assert c[0].token_ids != a


def test_stream_cancel_from_another_thread_keeps_tokens(checkpoint):
    import threading

    engine = load_engine(checkpoint)
    stream = engine.stream(prompts()[0], SamplingParams(max_tokens=400, ignore_eos=True))
    seen = []
    for event in stream:
        if event.kind == "token":
            seen += event.token_ids
            if len(seen) == 5:
                t = threading.Thread(target=stream.cancel)
                t.start()
                t.join()
        if event.kind == "done":
            assert event.finish_reason == "cancelled"
    assert 5 <= len(stream.token_ids) < 400
    assert stream.token_ids == seen
    assert not engine.has_unfinished()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_cpu_dense_kv_copy_matches_paged_gather(checkpoint):
    """The contiguous per-sequence KV copy gives the tokens of reading the pages, through a
    prefix-cache hit and through preemptions in a cache too small for all sequences."""
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    paged = load_engine(checkpoint, cpu_dense_kv=False, page_size=8)
    expected = [paged.generate([p], params)[0].token_ids for p in prompts()]
    dense = load_engine(checkpoint, page_size=8)
    assert dense.runner.use_dense_kv
    assert [dense.generate([p], params)[0].token_ids for p in prompts()] == expected
    # same prompts again: prefix-cache hits start each copy from the pages
    again = dense.generate(prompts(), params)
    assert [c.token_ids for c in again] == expected
    assert any(c.stats.cached_tokens for c in again)
    # 30 pages of 8 tokens cannot hold all four sequences at once: some get preempted
    small = load_engine(checkpoint, page_size=8, num_pages=30, max_num_batched_tokens=32)
    assert [c.token_ids for c in small.generate(prompts(), params)] == expected
    assert not small.runner.dense_kv  # copies are released with their sequences


def test_cpu_bf16_tracks_fp32(checkpoint):
    """The engine also runs in bf16 on the CPU: logits stay close to fp32."""
    import torch

    from engine.loading.loader import (
        build_model,
        load_checkpoint_weights,
        read_config,
        resolve_source,
    )
    from engine.runtime.llm_engine import prompt_logits

    source = resolve_source(checkpoint)
    cfg = read_config(source)
    model = build_model(cfg, torch.device("cpu"), torch.bfloat16)
    load_checkpoint_weights(model, source.path)
    from engine import Engine

    bf16 = Engine(model, cfg, None, dtype=torch.bfloat16)
    fp32 = load_engine(checkpoint)
    ids = prompts()[3]
    a, b = prompt_logits(fp32, ids), prompt_logits(bf16, ids)
    assert bf16.runner.kv.pool.dtype == torch.bfloat16
    assert (a - b).abs().max().item() < 0.1
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() > 0.9


@pytest.mark.parametrize("per_head", [False, True])  # K and V expanded / one head a call
@pytest.mark.parametrize("q_len,kv_len", [(5, 5), (7, 40), (1, 9), (16, 16 * 9)])
def test_lower_right_causal_matches_the_masked_reference(q_len, kv_len, per_head, monkeypatch):
    import torch.nn.functional as F

    from engine.layers import attention
    from engine.layers.attention import causal_mask, lower_right_causal

    if per_head:
        monkeypatch.setattr(attention, "EXPAND_KV_BYTES", 0)

    g = torch.Generator().manual_seed(q_len)
    q = torch.randn(1, 8, q_len, 16, generator=g)
    k, v = torch.randn(2, kv_len, 16, generator=g), torch.randn(2, kv_len, 16, generator=g)
    mask = causal_mask(q_len, kv_len, None, "cpu")
    ref = F.scaled_dot_product_attention(
        q, k[None], v[None], attn_mask=mask, scale=0.25, enable_gqa=True
    )
    assert torch.allclose(lower_right_causal(q, k, v, 0.25), ref, atol=1e-6)


@pytest.mark.parametrize("use_triton", [False, True])
def test_gather_from_the_host_tier_matches_gather_kv(use_triton):
    """The host-tier gather (K and V halves of each page copied straight into place) gives
    the rows gather_kv gives, for a shuffled page list and a partial last page."""
    from kernels import HAS_TRITON, INTERPRET

    if use_triton and not (HAS_TRITON and INTERPRET):
        pytest.skip("the Triton path runs here under TRITON_INTERPRET=1")
    from engine.layers.attention import gather_kv, gather_kv_from_host

    g = torch.Generator().manual_seed(0)
    kv = torch.randn(9, 3, 2, 16, 8, generator=g)  # [pages, Hkv, 2, P, D]
    pages = torch.tensor([4, 0, 7, 2])
    k, v = gather_kv_from_host(kv, pages, 55, torch.device("cpu"), use_triton=use_triton)
    rk, rv = gather_kv(kv, pages, 55)
    assert k.shape == (3, 55, 8) and torch.equal(k, rk) and torch.equal(v, rv)


@pytest.mark.parametrize("use_triton", [False, True])
def test_host_tier_prefill_attention_matches_dense(use_triton):
    """A prefill chunk over the host tier, one KV head gathered at a time (GQA 4, a partial
    last page), against SDPA over the whole gathered context with the causal mask."""
    import torch.nn.functional as F

    from engine.layers.attention import causal_mask, gather_kv, host_tier_attention
    from kernels import HAS_TRITON, INTERPRET

    if use_triton and not (HAS_TRITON and INTERPRET):
        pytest.skip("the Triton path runs here under TRITON_INTERPRET=1")
    g = torch.Generator().manual_seed(1)
    kv = torch.randn(9, 2, 2, 16, 8, generator=g)  # [pages, Hkv, 2, P, D]
    pages = torch.tensor([4, 0, 7, 2, 5])
    kv_len, T = 71, 9
    q = torch.randn(1, 8, T, 8, generator=g)
    got = host_tier_attention(q, kv, pages, kv_len, 0.3, use_triton=use_triton)
    k, v = gather_kv(kv, pages, kv_len)
    mask = causal_mask(T, kv_len, None, "cpu")
    ref = F.scaled_dot_product_attention(
        q, k[None], v[None], attn_mask=mask, scale=0.3, enable_gqa=True
    )
    assert torch.allclose(got, ref, atol=1e-5)


def test_a_step_cancelled_in_flight_is_not_planned_again(checkpoint):
    """On a GPU the next decode step is planned while one is in flight; a sequence cancelled
    meanwhile is finished (its blocks freed): planning it again took blocks for its whole
    length, never returned (found with a 128K context, which then left no room)."""
    from engine.runtime.scheduler import ScheduledSeq, SchedulerOutput

    engine = load_engine(checkpoint)
    req = engine.add_request(prompts()[3], SamplingParams(max_tokens=20, ignore_eos=True))
    for _ in range(3):
        engine.step()
    free = engine.block_manager.num_free_blocks
    req.cancelled.set()
    engine.step()
    assert req.done and engine.block_manager.num_free_blocks > free
    free = engine.block_manager.num_free_blocks
    assert engine._plan_ahead(SchedulerOutput([ScheduledSeq(req.seq, 1, True)], [])) is None
    assert engine.block_manager.num_free_blocks == free


def test_a_prefill_cancelled_mid_step_stops_at_the_next_layer(checkpoint):
    """A long prefill chunk takes seconds on a small CPU: a cancel that arrives while it
    runs ends the step after the layer running then, not after the whole model. The cancel
    is set from inside layer 0 here (as a thread would, while it runs); layer 1 must not
    run, the request ends cancelled with no token, its blocks are freed, and the engine
    then gives the tokens a fresh engine gives."""
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    want = load_engine(checkpoint).generate([prompts()[3]], params)[0].token_ids
    engine = load_engine(checkpoint)
    layers = engine.model.layers
    req = engine.add_request(prompts()[3], SamplingParams(max_tokens=8, ignore_eos=True))
    runs = []
    first, second = layers[0].forward, layers[1].forward

    def layer0(*args, **kw):
        runs.append(0)
        req.cancelled.set()
        return first(*args, **kw)

    def layer1(*args, **kw):
        runs.append(1)
        return second(*args, **kw)

    layers[0].forward, layers[1].forward = layer0, layer1
    try:
        engine.step()
    finally:
        del layers[0].forward, layers[1].forward  # back to the class's method
    assert runs == [0]
    assert req.done and req.seq.finish_reason == "cancelled" and not req.seq.completion_token_ids
    assert not engine.has_unfinished()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert engine.generate([prompts()[3]], params)[0].token_ids == want
