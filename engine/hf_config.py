"""A Hugging Face config.json read into a ModelConfig, defensively.

The engine computes four transformers classes. Every field that changes what one of them
computes is either implemented (and matched against transformers in the tests) or refused
by its name, in one line: a silent wrong answer is the worst defect an engine can have.
Where a config leaves a field out, the default is the transformers class's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ModelLoadError, UnsupportedModelError


@dataclass(frozen=True, slots=True)
class Family:
    """What transformers' class of one architecture computes, and reads from its config."""

    max_position_embeddings: int  # the class's default
    window: str  # "none": never slides; "all": sliding_window on every layer; "layers": Qwen's
    bias_fields: tuple[str, ...] = ()  # the bias settings the class reads
    qkv_bias: bool = False  # fixed q/k/v biases
    qk_norm: bool = False
    head_dim: int | None = None  # the default (None: hidden_size // num_attention_heads)
    sliding_window: int | None = None  # the default


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family(2048, "none", ("attention_bias", "mlp_bias")),
    "MistralForCausalLM": Family(131072, "all", sliding_window=4096),
    "Qwen2ForCausalLM": Family(32768, "layers", qkv_bias=True),
    "Qwen3ForCausalLM": Family(32768, "layers", ("attention_bias",), qk_norm=True, head_dim=128),
}
MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# hidden_act values engine.model computes as transformers' ACT2FN does
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new")
# rope types, each with the parameters it needs and those it reads
ROPE_REQUIRED: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "yarn": (),
}
# (original_max_position_embeddings beside linear or dynamic, and a factor beside the
# default type, are read by transformers as little as by the engine)
ROPE_OPTIONAL: dict[str, tuple[str, ...]] = {
    "default": ("factor", "original_max_position_embeddings"),
    "linear": ("original_max_position_embeddings",),
    "dynamic": ("original_max_position_embeddings",),
    "llama3": ("original_max_position_embeddings",),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "truncate"),
}  # fmt: skip
ROPE_TYPES = tuple(ROPE_REQUIRED)
# fields other families use to change these same computations (softcapping, muP-style
# multipliers, interleaved or skipped rotations, chunked attention, quantized weights):
# transformers' classes for the four architectures above would not compute them, so a
# config that sets one was written for another model
FOREIGN_FIELDS = (
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "query_pre_attn_scalar",
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "logits_scaling",
    "use_qk_norm",
    "rope_interleaved",
    "no_rope_layers",
    "sliding_window_pattern",
    "attention_chunk_size",
    "quantization_config",
)


def refuse(arch: str, setting: str, why: str = "") -> UnsupportedModelError:
    """The one-line refusal of a setting, named as the config writes it."""
    return UnsupportedModelError(
        f"{arch}: {setting} is not supported" + (f" ({why})" if why else "")
    )


def config_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of an HF config dict; raises on anything it cannot compute."""
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type")
    arch = archs[0] if archs else MODEL_TYPES.get(model_type or "", str(model_type))
    if arch not in FAMILIES:
        raise UnsupportedModelError(
            f"unsupported architecture {arch!r}; supported: {', '.join(FAMILIES)}"
        )
    fam = FAMILIES[arch]
    _refuse_foreign(cfg, arch)
    try:
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        layers = cfg["num_hidden_layers"]
        max_pos = cfg.get("max_position_embeddings") or fam.max_position_embeddings
        eos = cfg.get("eos_token_id")
        theta, scaling = _rope(cfg, arch, max_pos)
        return dict(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or fam.head_dim or hidden // heads,
            max_position_embeddings=max_pos,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            sliding_window=_sliding_window(cfg, arch, fam, layers),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            hidden_act=_activation(cfg, arch),
            qk_norm=fam.qk_norm,
            **_biases(cfg, arch, fam),
        )
    except KeyError as e:
        raise ModelLoadError(f"model config is missing {e.args[0]!r}") from None


def _set(value: Any) -> bool:
    """Whether a config value asks for something (null and false ask for nothing)."""
    return value is not None and value is not False


def _refuse_foreign(cfg: dict[str, Any], arch: str) -> None:
    for name in FOREIGN_FIELDS:
        value = cfg.get(name)
        if _set(value):
            if name == "quantization_config" and isinstance(value, dict):
                method = value.get("quant_method", "?")
                raise refuse(arch, f"quantization_config (quant_method {method!r})")
            raise refuse(arch, f"{name}={value!r}")


def _activation(cfg: dict[str, Any], arch: str) -> str:
    act = cfg.get("hidden_act") or "silu"
    if act not in ACTIVATIONS:
        raise refuse(arch, f"hidden_act {act!r}", f"supported: {', '.join(ACTIVATIONS)}")
    return act


def _biases(cfg: dict[str, Any], arch: str, fam: Family) -> dict[str, bool]:
    for name in ("attention_bias", "mlp_bias"):
        if cfg.get(name) and name not in fam.bias_fields:
            raise refuse(arch, f"{name}=true", f"transformers' {arch} has no such setting")
    attention = bool(cfg.get("attention_bias")) and "attention_bias" in fam.bias_fields
    mlp = bool(cfg.get("mlp_bias")) and "mlp_bias" in fam.bias_fields
    return {"qkv_bias": fam.qkv_bias or attention, "o_bias": attention, "mlp_bias": mlp}


def _sliding_window(cfg: dict[str, Any], arch: str, fam: Family, layers: int) -> int | None:
    """The window every layer slides over, or None; refuses windows on some layers only."""
    window = cfg.get("sliding_window", fam.sliding_window)
    types = cfg.get("layer_types")
    if types is not None and (
        not isinstance(types, list)
        or len(types) != layers
        or not all(t in ("full_attention", "sliding_attention") for t in types)
    ):
        raise refuse(
            arch,
            f"layer_types {types!r}",
            f"one full_attention or sliding_attention per layer, {layers} layers",
        )
    if fam.window == "none":
        # transformers' Llama never slides, whatever sliding_window says; a config that
        # asks for it was written for another model
        if window is not None and cfg.get("use_sliding_window"):
            raise refuse(arch, "use_sliding_window=true", "transformers' Llama never slides")
        if window is not None and "sliding_attention" in (types or ()):
            raise refuse(
                arch, "layer_types with sliding_attention", "transformers' Llama never slides"
            )
        return None
    if fam.window == "all":
        # transformers' Mistral slides every layer over sliding_window and ignores layer_types
        kind = "full_attention" if window is None else "sliding_attention"
        if types is not None and set(types) != {kind}:
            raise refuse(
                arch,
                f"layer_types other than {kind} on every layer",
                f"transformers' {arch} applies sliding_window={window} to all",
            )
        return _positive(arch, window)
    # Qwen: use_sliding_window turns the window on, for the layers layer_types says slide
    # (by default those from max_window_layers on); transformers sets the window to None
    # without use_sliding_window, and no layer slides then
    if not cfg.get("use_sliding_window") or window is None:
        return None
    first = cfg.get("max_window_layers", 28)
    if types is None:
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    sliding = types.count("sliding_attention")
    if sliding == layers:
        return _positive(arch, window)
    if sliding == 0:
        return None
    raise refuse(
        arch,
        f"use_sliding_window=true on {sliding} of {layers} layers (layer_types, "
        f"max_window_layers={first})",
        "the engine windows every layer or none",
    )


def _positive(arch: str, window: int | None) -> int | None:
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ModelLoadError(f"{arch}: sliding_window {window!r} is not a positive integer")
    return window


def _rope(cfg: dict[str, Any], arch: str, max_pos: int) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling with its rope_type) or refuses what engine.rope lacks."""
    # transformers 4.x: rope_scaling={"type"|"rope_type": ...}; 5.x: rope_parameters
    field = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    scaling = cfg.get(field) or {}
    if not isinstance(scaling, dict):
        raise ModelLoadError(f"{arch}: {field} {scaling!r} is not an object")
    nested = [k for k, v in scaling.items() if isinstance(v, dict)]
    if nested:
        raise refuse(arch, f"{field} per layer type ({', '.join(nested)})")
    scaling = {k: v for k, v in scaling.items() if v is not None}
    theta = float(scaling.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    partial = scaling.pop("partial_rotary_factor", None) or cfg.get("partial_rotary_factor")
    if partial is not None and partial != 1:
        raise refuse(arch, f"partial_rotary_factor={partial}", "the engine rotates whole heads")
    if rope_type not in ROPE_TYPES:
        raise refuse(
            arch, f"{field} rope_type {rope_type!r}", f"supported: {', '.join(ROPE_TYPES)}"
        )
    unknown = sorted(set(scaling) - set(ROPE_REQUIRED[rope_type] + ROPE_OPTIONAL[rope_type]))
    if unknown:
        raise refuse(arch, f"{field} {', '.join(unknown)} with rope_type {rope_type!r}")
    for key in ROPE_REQUIRED[rope_type]:
        if key not in scaling:
            raise ModelLoadError(f"{arch}: {field} of rope_type {rope_type!r} lacks {key!r}")
    if rope_type == "default":
        return theta, None
    if rope_type in ("llama3", "yarn"):
        # transformers takes a top-level original_max_position_embeddings over the one in
        # the rope dict (Phi-3's configs put the pretraining length there)
        top = cfg.get("original_max_position_embeddings")
        scaling["original_max_position_embeddings"] = (
            top or scaling.get("original_max_position_embeddings") or max_pos
        )
    scaling["rope_type"] = rope_type
    return theta, scaling
