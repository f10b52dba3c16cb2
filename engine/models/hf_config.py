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
# hidden_act values engine.models.causal_lm computes as transformers' ACT2FN does
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
    dims = _dimensions(cfg, arch, fam)
    max_pos = dims.pop("max_position_embeddings")
    theta, scaling = _rope(cfg, arch, max_pos)
    return dict(
        architecture=arch,
        **dims,
        max_position_embeddings=max_pos,
        rms_norm_eps=_number(cfg, "rms_norm_eps", arch, 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=_sliding_window(cfg, arch, fam, dims["num_layers"]),
        bos_token_id=next(iter(_token_ids(cfg, "bos_token_id", arch)), None),
        eos_token_ids=_token_ids(cfg, "eos_token_id", arch),
        hidden_act=_activation(cfg, arch),
        qk_norm=fam.qk_norm,
        **_biases(cfg, arch, fam),
    )


# the largest size of any one dimension: far above any real model's (vocabularies reach
# 256K, hidden sizes 16K), low enough that a typo cannot ask for a petabyte
MAX_DIMENSION = 1 << 24


def _dimensions(cfg: dict[str, Any], arch: str, fam: Family) -> dict[str, int]:
    """The model's sizes, each a whole number from 1 to MAX_DIMENSION: a 0 (or a string)
    would divide by zero, or fail deep in torch, instead of naming the field."""

    def size(key: str, default: int | None = None) -> int:
        value = cfg.get(key)
        if value is None:
            if default is None:
                raise ModelLoadError(f"model config is missing {key!r}")
            return default
        if type(value) is not int or not 1 <= value <= MAX_DIMENSION:
            raise ModelLoadError(
                f"{arch}: {key} is {_shown(value)}, not a whole number from 1 to {MAX_DIMENSION}"
            )
        return value

    hidden, heads = size("hidden_size"), size("num_attention_heads")
    if cfg.get("head_dim") is None and not fam.head_dim and hidden < heads:
        raise ModelLoadError(
            f"{arch}: hidden_size {hidden} is less than num_attention_heads {heads}"
        )
    return dict(
        vocab_size=size("vocab_size"),
        hidden_size=hidden,
        intermediate_size=size("intermediate_size"),
        num_layers=size("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=size("num_key_value_heads", heads),
        head_dim=size("head_dim", fam.head_dim or hidden // heads),
        max_position_embeddings=size("max_position_embeddings", fam.max_position_embeddings),
    )


def _number(cfg: dict[str, Any], key: str, arch: str, default: float) -> float:
    """A positive finite number (JSON's true is no number to us)."""
    value = cfg.get(key)
    if value is None:
        return default
    if type(value) not in (int, float) or not 0 < value < float("inf"):
        raise ModelLoadError(f"{arch}: {key} is {_shown(value)}, not a positive number")
    return float(value)


def _token_ids(cfg: dict[str, Any], key: str, arch: str) -> list[int]:
    value = cfg.get(key)
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(type(i) is int and i >= 0 for i in ids):
        raise ModelLoadError(f"{arch}: {key} is {_shown(value)}, not a token id or a list of them")
    return ids


def _shown(value: Any, limit: int = 40) -> str:
    """repr() of a value from the config, cut short (one line: repr escapes newlines)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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


def checked_rope_scaling(arch: str, scaling: dict[str, Any], max_pos: int) -> dict[str, Any] | None:
    """A rope_scaling dict given on its own (an override), checked as in a config."""
    if not isinstance(scaling, dict):
        raise ModelLoadError(f"{arch}: rope_scaling {scaling!r} is not an object")
    if "rope_theta" in scaling:
        raise ModelLoadError(f"{arch}: a rope_scaling override cannot set rope_theta")
    return _rope({"rope_scaling": scaling}, arch, max_pos)[1]


def _rope(cfg: dict[str, Any], arch: str, max_pos: int) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling with its rope_type) or refuses what engine.layers.rope lacks."""
    # transformers 4.x: rope_scaling={"type"|"rope_type": ...}; 5.x: rope_parameters
    field = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    scaling = cfg.get(field) or {}
    if not isinstance(scaling, dict):
        raise ModelLoadError(f"{arch}: {field} {scaling!r} is not an object")
    nested = [k for k, v in scaling.items() if isinstance(v, dict)]
    if nested:
        raise refuse(arch, f"{field} per layer type ({', '.join(nested)})")
    scaling = {k: v for k, v in scaling.items() if v is not None}
    theta = scaling.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0
    theta = _number({"rope_theta": theta}, "rope_theta", arch, 10000.0)
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
    for key, value in scaling.items():
        if key != "truncate" and (type(value) not in (int, float) or value != value):
            raise ModelLoadError(f"{arch}: {field} {key} is {_shown(value)}, not a number")
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
