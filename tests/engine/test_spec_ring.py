"""The ring-window KV of the self-draft and draft-model proposers: attention over the ring is
attention over the sinks and the last W positions, drafted tokens in the tail leave the
context untouched, and the memory does not grow with the context."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from engine.spec.ring import RingKV, ring_forward
from tests.engine.conftest import load_engine, tiny_checkpoint


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    cfg = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    return load_engine(tiny_checkpoint(tmp_path_factory, "ring", cfg))


def new_ring(engine, sinks, window, tail=4) -> RingKV:
    c = engine.model_config
    return RingKV(c.num_layers, c.num_kv_heads, c.head_dim, sinks, window, tail,
                  torch.device("cpu"), torch.float32)  # fmt: skip


def windowed_logits(engine, ids: list[int], sinks: int, window: int, chunk: int) -> torch.Tensor:
    """Reference: the model over the whole sequence fed in chunks, where position i, in the
    chunk that starts at c, attends to positions j <= i with j < sinks or j >= c - window
    (the ring before its chunk, and the chunk); the last position's logits."""
    model, c = engine.model, engine.model_config
    T = len(ids)
    cos, sin = engine.runner.rope(torch.arange(T))
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    mask = (j <= i) & ((j < sinks) | (j >= (i // chunk) * chunk - window))
    x, residual = model.embed_tokens(torch.tensor(ids)), None
    from kernels.rope_kv import apply_rope

    with torch.inference_mode():
        for layer in model.layers:
            if residual is None:
                h, residual = layer.input_layernorm(x), x
            else:
                h, residual = layer.input_layernorm(x, residual)
            a = layer.self_attn
            q, k, v = a.qkv_proj(h).split([a.q_size, a.kv_size, a.kv_size], -1)
            q = apply_rope(q.view(T, c.num_heads, -1), cos, sin).transpose(0, 1)[None]
            k = apply_rope(k.view(T, c.num_kv_heads, -1), cos, sin).transpose(0, 1)[None]
            v = v.view(T, c.num_kv_heads, -1).transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            h = a.o_proj(o[0].transpose(0, 1).reshape(T, -1))
            h, residual = layer.post_attention_layernorm(h, residual)
            x = layer.mlp(h)
        return model.compute_logits(model.norm(x[-1:], residual[-1:])[0])[0]


@pytest.mark.parametrize("sinks,window,chunk", [(0, 512, 1), (2, 7, 1), (3, 9, 5), (1, 4, 3)])
def test_ring_attention_is_sinks_plus_window(engine, sinks, window, chunk):
    """Fed in chunks (commit mode), the ring's last logits equal the windowed reference; a
    chunk's queries see the ring before it and the chunk itself causally."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 300, (40,), generator=g).tolist()
    ring = new_ring(engine, sinks, window)
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        logits = ring_forward(engine.model, engine.runner.rope, ring, part,
                              list(range(start, start + len(part))), to_tail=False)  # fmt: skip
        ref = windowed_logits(engine, ids[: start + len(part)], sinks, window, chunk)
        torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    assert (ring.pos >= 0).sum() == min(len(ids), sinks + window)


def test_a_ring_over_a_long_prefix_keeps_only_sinks_and_window(engine):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (60,), generator=g).tolist()
    ring = new_ring(engine, 2, 8)
    ring_forward(engine.model, engine.runner.rope, ring, ids, list(range(60)), to_tail=False)
    assert sorted(ring.pos[:10].tolist()) == [0, 1] + list(range(52, 60))


def test_drafted_tokens_stay_in_the_tail(engine):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 300, (20,), generator=g).tolist()
    ring = new_ring(engine, 2, 8, tail=3)
    rope, model = engine.runner.rope, engine.model
    ring_forward(model, rope, ring, ids, list(range(20)), to_tail=False)
    before = ring.k.clone(), ring.pos.clone()
    a = ring_forward(model, rope, ring, [5], [20], to_tail=True)
    ring_forward(model, rope, ring, [6], [21], to_tail=True)
    assert ring.tail_len == 2
    ring.clear_tail()
    assert torch.equal(ring.k[:, :, :10], before[0][:, :, :10])
    assert torch.equal(ring.pos, before[1])
    # the same draft again gives the same logits: nothing of the first draft remained
    torch.testing.assert_close(ring_forward(model, rope, ring, [5], [20], True), a)
    # committing a tail entry makes it context: it replaces the oldest window position
    ring.commit_tail(1)
    assert 20 in ring.pos[:10].tolist() and 12 not in ring.pos[:10].tolist()


class _Seq:
    """What a proposer reads of a sequence: its id, tokens and sampling parameters."""

    def __init__(self, seq_id: int, token_ids: list[int]) -> None:
        from engine import SamplingParams

        self.seq_id, self.token_ids, self.params = seq_id, token_ids, SamplingParams()

    def __len__(self) -> int:
        return len(self.token_ids)


def drafts_agree(model, rope, capture: bool) -> None:
    """A DraftModel's greedy drafts through its step graph equal its eager loop's, tokens
    and ring, across verifications that accept part of a draft (the graph's warm-up leaves
    garbage only in the last tail entry, which holds no position)."""
    from engine.spec.proposers import DraftModel

    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 300, (30,), generator=g).tolist()
    eager = DraftModel(model, rope, sinks=2, window=8, max_k=6)
    steps = DraftModel(model, rope, sinks=2, window=8, max_k=6)
    eager.graphs = False
    steps.graphs, steps.capture = True, capture
    a, b = _Seq(1, list(tokens)), _Seq(1, list(tokens))
    for k, accept, bonus in ((4, 2, 7), (5, 0, 9), (1, 1, 3), (6, 6, 11)):
        da, db = eager.propose(a, k), steps.propose(b, k)
        assert da.tokens == db.tokens and len(da.tokens) == k
        ra, rb = eager.rings[1], steps.rings[1]
        assert torch.equal(ra.pos, rb.pos) and ra.tail_len == rb.tail_len
        torch.testing.assert_close(ra.k[:, :, :-1], rb.k[:, :, :-1], rtol=0, atol=0)
        for p, s in ((eager, a), (steps, b)):
            p.accepted(s, k, accept)
            s.token_ids += da.tokens[:accept] + [bonus]
    assert 1 in steps.steppers
    steps.release(1)
    assert 1 not in steps.steppers


def test_step_graph_drafts_as_the_eager_loop(engine):
    """engine.spec.ring_graph's steps, run eagerly (a CPU has no graphs)."""
    from engine.spec.proposers import DraftModel

    assert not DraftModel(engine.model, engine.runner.rope).graphs  # (a CPU: eager)
    drafts_agree(engine.model, engine.runner.rope, capture=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_step_graph_on_the_gpu(tmp_path_factory):
    """The same, with the steps replayed from a CUDA graph."""
    from engine import Engine

    cfg = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    eng = Engine.load(tiny_checkpoint(tmp_path_factory, "ring_gpu", cfg), device="cuda")
    drafts_agree(eng.model, eng.runner.rope, capture=True)
