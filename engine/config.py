"""Model and engine configuration."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError, UnsupportedModelError

# HF architecture name -> the switches our one model implementation needs
ARCHITECTURES: dict[str, dict[str, bool]] = {
    "LlamaForCausalLM": {"qkv_bias": False, "qk_norm": False},
    "MistralForCausalLM": {"qkv_bias": False, "qk_norm": False},
    "Qwen2ForCausalLM": {"qkv_bias": True, "qk_norm": False},
    "Qwen3ForCausalLM": {"qkv_bias": False, "qk_norm": True},
}
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # includes "rope_type"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}"
            )
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise UnsupportedModelError(
                f"unsupported rope_scaling type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}"
            )

    @property
    def rope_type(self) -> str:
        return (self.rope_scaling or {}).get("rope_type", "default")

    @property
    def context_window(self) -> int:
        """Longest sequence the model handles: dynamic NTK scaling extends the trained window."""
        if self.rope_type == "dynamic":
            return int(self.max_position_embeddings * self.rope_scaling["factor"])
        return self.max_position_embeddings

    @property
    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        layer = attn + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else _arch_from_model_type(cfg.get("model_type"))
        if arch not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}"
            )
        try:
            hidden = cfg["hidden_size"]
            heads = cfg["num_attention_heads"]
            eos = cfg.get("eos_token_id")
            eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
            # Qwen2 configs carry a sliding_window that only applies with use_sliding_window
            window = cfg.get("sliding_window")
            if arch == "Qwen2ForCausalLM" and not cfg.get("use_sliding_window", False):
                window = None
            if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and not cfg.get(
                "use_sliding_window", False
            ):
                window = None
            return cls(
                architecture=arch,
                vocab_size=cfg["vocab_size"],
                hidden_size=hidden,
                intermediate_size=cfg["intermediate_size"],
                num_layers=cfg["num_hidden_layers"],
                num_heads=heads,
                num_kv_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=cfg.get("head_dim") or hidden // heads,
                max_position_embeddings=cfg.get("max_position_embeddings", 4096),
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=_rope_theta(cfg),
                rope_scaling=_rope_scaling(cfg),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                sliding_window=window,
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                **ARCHITECTURES[arch],
            )
        except KeyError as e:
            raise ModelLoadError(f"model config is missing {e.args[0]!r}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:  # (UnicodeDecodeError: a ValueError)
            raise ModelLoadError(f"cannot read model config {path}: {e}") from None
        if not isinstance(data, dict):
            raise ModelLoadError(f"bad model config {path}: not a JSON object")
        return cls.from_hf(data)


def _arch_from_model_type(model_type: str | None) -> str:
    return {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    }.get(model_type or "", str(model_type))


def _rope_theta(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    return float(params.get("rope_theta") or cfg.get("rope_theta") or 10000.0)


def _rope_scaling(cfg: dict[str, Any]) -> dict[str, Any] | None:
    # transformers 4.x: rope_scaling={"type"|"rope_type": ...}; 5.x: rope_parameters={"rope_type": ...}
    scaling = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("rope_theta", None)
    if rope_type == "default":
        return None
    scaling["rope_type"] = rope_type
    if rope_type in ("llama3", "yarn"):
        scaling.setdefault(
            "original_max_position_embeddings",
            cfg.get("original_max_position_embeddings") or cfg.get("max_position_embeddings"),
        )
    return scaling


@dataclass(slots=True)
class EngineConfig:
    """Engine-wide options. Per-request options live in SamplingParams."""

    page_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512  # prefill chunk budget per step
    num_pages: int | None = None  # None: sized from max_model_len * max_num_seqs (CPU) or memory
    max_model_len: int | None = None  # None: the model's window
    kv_cache_memory: int | None = None  # bytes for the KV pool; overrides num_pages
    enable_prefix_caching: bool = True
    cuda_graphs: bool = True
    cpu_dense_kv: bool = True  # CPU: keep running sequences' KV contiguous too (2x KV memory)
    # sparse decode over the tiered KV cache (engine.kv.SparseConfig); None: dense attention
    sparse: object | None = None
    # speculative decoding (engine.spec.decoder.SpecConfig); None: off
    speculate: object | None = None
    # benchmarks with dummy weights only: prefill steps write their KV (host tier, page
    # summaries) but attend to nothing (the attention output is zeros), so a 500K-token
    # context is built in seconds instead of minutes of causal attention; decode steps are
    # unchanged, and with dummy weights the KV's values mean nothing either way
    skip_prefill_attention: bool = False

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
