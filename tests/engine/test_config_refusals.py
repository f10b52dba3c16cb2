"""Config settings the engine computes (matched against transformers on tiny random
checkpoints) and those it refuses, each by its name, in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from engine import ContextTooLongError, Engine, EngineConfig, SamplingParams
from engine.config import ModelConfig
from engine.errors import ModelLoadError, UnsupportedModelError
from engine.runtime.llm_engine import prompt_logits
from tests.engine.conftest import tiny_checkpoint

SMALL = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def ids_of(n: int, seed: int = 1) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, SMALL["vocab_size"], (n,), generator=gen).tolist()


def hf_logits(path: str, ids: list[int]) -> torch.Tensor:
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


def load(path: str, **cfg) -> Engine:
    return Engine.load(path, device="cpu", config=EngineConfig(page_size=8, **cfg))


def assert_matches(path: str, n: int = 70) -> None:
    ids = ids_of(n)
    diff = (prompt_logits(load(path), ids) - hf_logits(path, ids)).abs().max().item()
    assert diff < 1e-4, diff


def refusal(path_or_config, error=UnsupportedModelError) -> str:
    """The one-line message loading this checkpoint directory or config dict raises."""
    with pytest.raises(error) as info:
        if isinstance(path_or_config, dict):
            ModelConfig.from_hf(path_or_config)
        else:
            load(path_or_config)
    message = str(info.value)
    assert "\n" not in message
    return message


def hf_dict(config) -> dict:
    """The config.json transformers writes for this config."""
    return json.loads(config.to_json_string())


# -- activations --------------------------------------------------------------------------


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh", "gelu_new", "swish"])
def test_llama_activation_matches_transformers(tmp_path_factory, act):
    assert_matches(tiny_checkpoint(tmp_path_factory, act, LlamaConfig(**SMALL, hidden_act=act)))


@pytest.mark.parametrize("act", ["relu2", "quick_gelu"])
def test_other_activation_refused_by_name(tmp_path_factory, act):
    path = tiny_checkpoint(tmp_path_factory, act, LlamaConfig(**SMALL, hidden_act=act))
    message = refusal(path)
    assert "hidden_act" in message and repr(act) in message


# -- biases -------------------------------------------------------------------------------


BIASES = {
    "llama-attention-bias": lambda: LlamaConfig(**SMALL, attention_bias=True),
    "llama-mlp-bias": lambda: LlamaConfig(**SMALL, mlp_bias=True),
    "llama-both-biases": lambda: LlamaConfig(**SMALL, attention_bias=True, mlp_bias=True),
    "qwen3-attention-bias": lambda: Qwen3Config(**SMALL, head_dim=32, attention_bias=True),
}


@pytest.mark.parametrize("name", list(BIASES))
def test_bias_settings_match_transformers(tmp_path_factory, name):
    path = tiny_checkpoint(tmp_path_factory, name, BIASES[name]())
    # transformers initialises biases to zero: give them values, or a test could not fail
    weights = Path(path) / "model.safetensors"
    tensors = load_file(weights)
    gen = torch.Generator().manual_seed(3)
    for key in tensors:
        if key.endswith(".bias"):
            tensors[key] = torch.randn(tensors[key].shape, generator=gen) * 0.5
    save_file(tensors, weights, metadata={"format": "pt"})
    assert_matches(path)


@pytest.mark.parametrize(
    "arch, field",
    [
        ("Qwen2ForCausalLM", "mlp_bias"),
        ("Qwen2ForCausalLM", "attention_bias"),
        ("MistralForCausalLM", "attention_bias"),
        ("Qwen3ForCausalLM", "mlp_bias"),
    ],
)
def test_bias_a_family_lacks_refused_by_name(arch, field):
    config = {"architectures": [arch], **SMALL, "num_hidden_layers": 2, field: True}
    assert field in refusal(config)


# -- sliding windows ----------------------------------------------------------------------


def qwen(family: str, **kw):
    cls, extra = {"qwen2": (Qwen2Config, {}), "qwen3": (Qwen3Config, {"head_dim": 32})}[family]
    return cls(**{**SMALL, "num_hidden_layers": 4}, **extra, **kw)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("max_window_layers", [0, 4])  # every layer slides / none does
def test_qwen_uniform_sliding_window_matches_transformers(
    tmp_path_factory, family, max_window_layers
):
    config = qwen(
        family, use_sliding_window=True, sliding_window=24, max_window_layers=max_window_layers
    )
    path = tiny_checkpoint(tmp_path_factory, f"{family}-{max_window_layers}", config)
    assert_matches(path, n=70)
    expected = 24 if max_window_layers == 0 else None
    assert load(path).model_config.sliding_window == expected


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_mixed_sliding_layers_refused_by_name(tmp_path_factory, family):
    config = qwen(family, use_sliding_window=True, sliding_window=24, max_window_layers=2)
    assert config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    message = refusal(tiny_checkpoint(tmp_path_factory, f"{family}-mixed", config))
    assert "layer_types" in message and "max_window_layers=2" in message


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_explicit_mixed_layer_types_refused_by_name(family):
    layer_types = ["sliding_attention", "full_attention"] * 2
    config = qwen(family, use_sliding_window=True, sliding_window=24, layer_types=layer_types)
    assert "layer_types" in refusal(hf_dict(config))


def test_qwen_layer_types_without_use_sliding_window_do_not_slide():
    # transformers sets sliding_window to None unless use_sliding_window: no layer slides
    config = hf_dict(qwen("qwen2", sliding_window=24, max_window_layers=0))
    config["layer_types"] = ["sliding_attention"] * 4
    assert ModelConfig.from_hf(config).sliding_window is None


def test_llama_asking_for_a_sliding_window_refused_by_name():
    config = {"architectures": ["LlamaForCausalLM"], **SMALL, "sliding_window": 24}
    assert ModelConfig.from_hf(config).sliding_window is None  # transformers ignores it
    message = refusal({**config, "use_sliding_window": True})
    assert "use_sliding_window" in message


def test_mistral_mixed_layer_types_refused_by_name():
    config = {"architectures": ["MistralForCausalLM"], **SMALL, "sliding_window": 24}
    assert ModelConfig.from_hf(config).sliding_window == 24
    message = refusal({**config, "layer_types": ["full_attention", "sliding_attention"]})
    assert "layer_types" in message


def test_defaults_for_absent_fields_are_transformers_own():
    base = {k: v for k, v in SMALL.items() if k != "max_position_embeddings"}
    for arch, cls in [
        ("LlamaForCausalLM", LlamaConfig),
        ("MistralForCausalLM", MistralConfig),
        ("Qwen2ForCausalLM", Qwen2Config),
        ("Qwen3ForCausalLM", Qwen3Config),
    ]:
        ours, theirs = ModelConfig.from_hf({"architectures": [arch], **base}), cls(**base)
        assert ours.max_position_embeddings == theirs.max_position_embeddings, arch
        head_dim = (
            getattr(theirs, "head_dim", None) or base["hidden_size"] // base["num_attention_heads"]
        )
        assert ours.head_dim == head_dim, arch
        assert ours.sliding_window == getattr(theirs, "sliding_window", None), arch


# -- the supported families' real configs ------------------------------------------------

QWEN25_CODER_05B = {  # Qwen/Qwen2.5-Coder-0.5B-Instruct's config.json
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_06B = {  # Qwen/Qwen3-0.6B's config.json
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
LLAMA31_8B = {  # meta-llama/Llama-3.1-8B-Instruct's config.json
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}
MISTRAL_7B_V01 = {  # mistralai/Mistral-7B-v0.1's config.json
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32000,
}
SMOLLM2_135M = {  # HuggingFaceTB/SmolLM2-135M-Instruct's config.json
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers.js_config": {"kv_cache_dtype": {"fp16": "float16", "q4f16": "float16"}},
    "use_cache": True,
    "vocab_size": 49152,
}


@pytest.mark.parametrize(
    "config, window, rope",
    [
        (QWEN25_CODER_05B, None, "default"),
        (QWEN3_06B, None, "default"),
        (LLAMA31_8B, None, "llama3"),
        (MISTRAL_7B_V01, 4096, "default"),
        (SMOLLM2_135M, None, "default"),
    ],
    ids=["qwen2.5-coder-0.5b", "qwen3-0.6b", "llama-3.1-8b", "mistral-7b", "smollm2-135m"],
)
def test_real_configs_of_the_supported_families_load(config, window, rope):
    cfg = ModelConfig.from_hf(config)
    assert (cfg.sliding_window, cfg.rope_type) == (window, rope)
    assert cfg.hidden_act == "silu" and not cfg.mlp_bias and not cfg.o_bias


def test_transformers_written_configs_of_the_supported_families_load():
    for config in [
        LlamaConfig(**SMALL, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
        LlamaConfig(**SMALL, rope_scaling={"rope_type": "linear", "factor": 2.0}),
        Qwen2Config(**SMALL),
        Qwen3Config(**SMALL),
        MistralConfig(**SMALL),
    ]:
        ModelConfig.from_hf(hf_dict(config))


# -- rope ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}},
         "partial_rotary_factor"),
        ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
         "longrope"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e6}}},
         "rope_parameters"),
        ({"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}, "mrope"),
        ({"rope_scaling": {"rope_type": "default", "mrope_section": [16, 24, 24]}},
         "mrope_section"),
    ],
)  # fmt: skip
def test_rope_settings_refused_by_name(extra, field):
    config = {"architectures": ["LlamaForCausalLM"], **SMALL, **extra}
    assert field in refusal(config)


@pytest.mark.parametrize(
    "scaling, key",
    [
        ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}, "low_freq_factor"),
        ({"rope_type": "linear"}, "factor"),
        ({"rope_type": "dynamic"}, "factor"),
    ],
)
def test_rope_scaling_lacking_a_parameter_is_a_load_error(scaling, key):
    config = {"architectures": ["LlamaForCausalLM"], **SMALL, "rope_scaling": scaling}
    message = refusal(config, ModelLoadError)
    assert key in message and scaling["rope_type"] in message


def test_yarn_original_max_position_embeddings_at_the_top_level_wins(tmp_path_factory):
    # transformers takes a top-level value over the one in the rope dict (Phi-3's configs)
    config = LlamaConfig(**SMALL, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    path = tiny_checkpoint(tmp_path_factory, "yarn-top-level", config)
    written = json.loads((Path(path) / "config.json").read_text())
    written["rope_parameters"]["original_max_position_embeddings"] = 256
    written["original_max_position_embeddings"] = 64
    (Path(path) / "config.json").write_text(json.dumps(written))
    assert load(path).model_config.rope_scaling["original_max_position_embeddings"] == 64
    assert_matches(path)


# -- dynamic NTK: computed within max_position_embeddings, refused beyond ----------------

DYNAMIC = {**SMALL, "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def dynamic_checkpoint(tmp_path_factory):
    config = LlamaConfig(**DYNAMIC, rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    return tiny_checkpoint(tmp_path_factory, "dynamic", config)


def generated_logits(engine: Engine, ids: list[int], max_tokens: int):
    """(the logits the first token was sampled from, the completion, its stats)."""
    seen: list[torch.Tensor] = []
    model, compute = engine.model, engine.model.compute_logits

    def record(hidden, exact=False):
        logits = compute(hidden, exact)
        if len(logits):  # (a prefill chunk that samples nothing computes no rows)
            seen.append(logits.float().clone())
        return logits

    model.compute_logits = record
    try:
        out = engine.generate([ids], SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0]
    finally:
        del model.compute_logits
    return seen[0][0], out


@pytest.mark.parametrize("chunk", [48, 128, 512])
def test_dynamic_rope_does_not_depend_on_chunking(dynamic_checkpoint, chunk):
    ids = ids_of(250, seed=4)
    engine = load(dynamic_checkpoint, max_num_batched_tokens=chunk)
    first, out = generated_logits(engine, ids, max_tokens=5)
    hf = AutoModelForCausalLM.from_pretrained(dynamic_checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1]
        greedy = hf.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)[0, 250:]
    assert (first - ref).abs().max().item() < 1e-4
    assert out.token_ids == greedy.tolist()


def test_dynamic_rope_does_not_depend_on_a_served_prefix(dynamic_checkpoint):
    engine = load(dynamic_checkpoint, max_num_batched_tokens=48)
    ids = ids_of(250, seed=5)
    engine.generate([ids[:200]], SamplingParams(max_tokens=4, ignore_eos=True))
    first, out = generated_logits(engine, ids, max_tokens=3)
    assert out.stats.cached_tokens >= 192  # the first prompt's full pages were reused
    ref = hf_logits(dynamic_checkpoint, ids)[-1]
    assert (first - ref).abs().max().item() < 1e-4


def test_dynamic_rope_beyond_max_position_embeddings_refused_by_name(dynamic_checkpoint):
    engine = load(dynamic_checkpoint)
    assert engine.max_model_len == 256
    for run in (
        lambda ids: engine.generate([ids], SamplingParams(max_tokens=4)),
        lambda ids: prompt_logits(engine, ids),
    ):
        with pytest.raises(ContextTooLongError) as info:
            run(ids_of(300))
        message = str(info.value)
        assert "\n" not in message
        assert "'dynamic'" in message and "max_position_embeddings" in message


def test_prompt_logits_longer_than_the_window_is_a_context_error(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory, "window", LlamaConfig(**DYNAMIC))
    engine = load(path)
    with pytest.raises(ContextTooLongError, match="longer than the model's window of 256"):
        prompt_logits(engine, ids_of(257))
    assert prompt_logits(engine, ids_of(256)).shape == (256, SMALL["vocab_size"])


# -- tied embeddings ----------------------------------------------------------------------


def test_tied_config_with_its_own_head_matches_transformers(tmp_path_factory):
    # transformers unties a head the checkpoint stores with other values than the embedding
    path = tiny_checkpoint(tmp_path_factory, "tied", LlamaConfig(**SMALL, tie_word_embeddings=True))
    weights = Path(path) / "model.safetensors"
    tensors = load_file(weights)
    assert "lm_head.weight" not in tensors
    gen = torch.Generator().manual_seed(6)
    tensors["lm_head.weight"] = torch.randn(
        SMALL["vocab_size"], SMALL["hidden_size"], generator=gen
    )
    save_file(tensors, weights, metadata={"format": "pt"})
    assert_matches(path)


# -- settings of other families -----------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("attn_logit_softcapping", 50.0),
        ("final_logit_softcapping", 30.0),
        ("query_pre_attn_scalar", 256),
        ("embedding_multiplier", 12.0),
        ("residual_multiplier", 0.22),
        ("attention_multiplier", 0.015625),
        ("logits_scaling", 8.0),
        ("use_qk_norm", True),
        ("quantization_config", {"quant_method": "gptq", "bits": 4}),
    ],
)
def test_settings_of_other_families_refused_by_name(field, value):
    config = {"architectures": ["LlamaForCausalLM"], **SMALL, field: value}
    assert field in refusal(config)
    ModelConfig.from_hf({**config, field: None})  # a null value asks for nothing
