"""Our forward pass against transformers', on tiny random checkpoints of every family."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from engine import SamplingParams
from engine.runtime.llm_engine import prompt_logits
from tests.engine.conftest import load_engine, tiny_checkpoint

SMALL = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

FAMILIES = {
    "llama": lambda: LlamaConfig(**SMALL),
    "llama-tied": lambda: LlamaConfig(**SMALL, tie_word_embeddings=True),
    "llama3-rope": lambda: LlamaConfig(**SMALL, rope_scaling=LLAMA3_ROPE, rope_theta=500000.0),
    "llama-linear-rope": lambda: LlamaConfig(
        **SMALL, rope_scaling={"rope_type": "linear", "factor": 2.0}
    ),
    # within max_position_embeddings, the engine's window for dynamic NTK (beyond it, the
    # rotations would depend on the sequence's length: test_config_refusals)
    "llama-dynamic-rope": lambda: LlamaConfig(
        **{**SMALL, "max_position_embeddings": 64},
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    ),
    "llama-yarn-rope": lambda: LlamaConfig(
        **SMALL,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    ),
    "qwen2": lambda: Qwen2Config(**SMALL),
    "qwen3": lambda: Qwen3Config(**SMALL, head_dim=32),
    "mistral": lambda: MistralConfig(**SMALL, sliding_window=None),
    "mistral-window": lambda: MistralConfig(**SMALL, sliding_window=24),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory, request.param, FAMILIES[request.param]())
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return request.param, path, hf


def test_logits_match_transformers(family):
    name, path, hf = family
    engine = load_engine(path, page_size=8)
    ids = torch.randint(0, SMALL["vocab_size"], (45,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    ours = prompt_logits(engine, ids.tolist())
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-4, name


def test_greedy_matches_transformers_generate(family):
    name, path, hf = family
    # a small prefill chunk so the prompt goes through chunked prefill over the paged cache
    engine = load_engine(path, page_size=4, max_num_batched_tokens=16)
    ids = torch.randint(0, SMALL["vocab_size"], (1, 21), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)[0, 21:]
    out = engine.generate([ids[0].tolist()], SamplingParams(max_tokens=32, ignore_eos=True))[0]
    assert out.token_ids == ref.tolist(), name


def test_rope_scaling_override_matches_transformers_with_that_scaling(tmp_path_factory):
    """EngineConfig.rope_scaling (YaRN over the trained window, Qwen2.5's long-context
    recipe) stretches the window by the factor and computes what transformers computes with
    that scaling in the config, past the trained window."""
    from engine import Engine, EngineConfig

    short = Qwen2Config(**{**SMALL, "max_position_embeddings": 128})
    path = tiny_checkpoint(tmp_path_factory, "qwen2-short", short)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    long_cfg = Qwen2Config(**{**SMALL, "max_position_embeddings": 512}, rope_scaling=yarn)
    hf = AutoModelForCausalLM.from_config(long_cfg, dtype=torch.float32).eval()
    hf.load_state_dict(AutoModelForCausalLM.from_pretrained(path).state_dict())
    plain = Engine.load(path, device="cpu", dtype="float32", config=EngineConfig())
    engine = Engine.load(path, device="cpu", dtype="float32",
                         config=EngineConfig(rope_scaling={"rope_type": "yarn", "factor": 4.0}))  # fmt: skip
    assert (plain.max_model_len, engine.max_model_len) == (128, 512)
    ids = torch.randint(0, SMALL["vocab_size"], (300,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    ours = prompt_logits(engine, ids.tolist())
    assert (ours - ref).abs().max().item() < 1e-4
    # the scaling changes the logits (the override is applied, not ignored)
    assert (prompt_logits(plain, ids[:120].tolist()) - ref[:120]).abs().max().item() > 1e-3


@pytest.mark.parametrize(
    "scaling, says",
    [
        ({"rope_type": "dynamic", "factor": 2.0}, "does not extend the window"),
        ({"rope_type": "yarn"}, "needs a .factor. above 1"),
        ({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}, "cannot set rope_theta"),
        ("yarn", "not an object"),
    ],
)
def test_rope_scaling_override_refuses_by_name(tmp_path_factory, scaling, says):
    from engine import Engine, EngineConfig
    from engine.errors import EngineError

    path = tiny_checkpoint(tmp_path_factory, "qwen2-refuse", Qwen2Config(**SMALL))
    with pytest.raises(EngineError, match=says):
        Engine.load(path, device="cpu", dtype="float32", config=EngineConfig(rope_scaling=scaling))
