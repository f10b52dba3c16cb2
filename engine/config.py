"""Model and engine configuration."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.models.hf_config import ROPE_TYPES, config_fields


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
    o_bias: bool = False  # (with qkv_bias: Llama's and Qwen3's attention_bias)
    mlp_bias: bool = False
    qk_norm: bool = False
    hidden_act: str = "silu"  # one of engine.models.hf_config.ACTIVATIONS
    sliding_window: int | None = None  # on every layer (engine.models.hf_config refuses others)
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
        """Longest sequence the model handles. Dynamic NTK scaling would extend the trained
        window, but only by rotating with a base that follows the sequence's current length
        (see window_note), so the engine stops at the trained window."""
        return self.max_position_embeddings

    @property
    def window_note(self) -> str | None:
        """Why the window is shorter than the config suggests, for context-length errors."""
        if self.rope_type != "dynamic":
            return None
        return (
            f"rope_scaling 'dynamic' (factor {self.rope_scaling['factor']}) is computed only up "
            f"to max_position_embeddings={self.max_position_embeddings}: beyond it, dynamic NTK "
            "rotates every key with a base that depends on the sequence's length, so keys "
            "cached at one length (earlier chunks, reused prefixes) would not match a fresh pass"
        )

    def with_rope_scaling(self, scaling: dict[str, Any]) -> ModelConfig:
        """This config with its RoPE stretched past the trained window, as vLLM's and
        llama.cpp's overrides do (Qwen2.5's long-context recipe: {"rope_type": "yarn",
        "factor": 4.0, "original_max_position_embeddings": 32768}): `scaling` is checked
        as a config's rope_scaling is, and the window becomes factor x the original
        length. Only "yarn" and "linear" extend a window this way; others are refused."""
        from dataclasses import replace

        from engine.models.hf_config import checked_rope_scaling

        rope = checked_rope_scaling(self.architecture, scaling, self.max_position_embeddings)
        if rope is None or rope["rope_type"] not in ("yarn", "linear"):
            kind = "default" if rope is None else rope["rope_type"]
            raise UnsupportedModelError(
                f"a rope_scaling override of type {kind!r} does not extend the window; "
                "use yarn or linear"
            )
        if self.rope_scaling is not None:
            raise UnsupportedModelError(
                f"the model already scales its RoPE ({self.rope_scaling['rope_type']}); "
                "a second scaling on top of it is not computed"
            )
        if not rope.get("factor") or rope["factor"] <= 1:
            raise ModelLoadError("a rope_scaling override needs a 'factor' above 1")
        orig = int(rope.get("original_max_position_embeddings") or self.max_position_embeddings)
        rope["original_max_position_embeddings"] = orig
        return replace(self, rope_scaling=rope, max_position_embeddings=int(orig * rope["factor"]))

    @property
    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        layer = attn + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """From a Hugging Face config dict; refuses, by name, any setting the engine does
        not compute (engine.models.hf_config)."""
        return cls(**config_fields(cfg))

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:  # (UnicodeDecodeError: a ValueError)
            raise ModelLoadError(f"cannot read model config {path}: {e}") from None
        if not isinstance(data, dict):
            raise ModelLoadError(f"bad model config {path}: not a JSON object")
        return cls.from_hf(data)


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
    # verifications in CUDA graphs (the tiered cache on a GPU: its attention needs no host
    # lists); checked against eager on the H200 (bench.gpu_verify_check: same logits, same
    # speculative tokens). False: verify eagerly
    verify_graphs: bool = True
    # the GPU tier's slot allocation on a GPU (kernels.tier_alloc): "triton" (its kernels)
    # or "torch" (their reference, the CPU's path)
    tier_alloc: str = "triton"
    # programs of the UVA gather that fetches pages from the host tier (kernels.uva_gather;
    # kernels.views.GATHER_PROGRAMS: 16 gather at 49.2 GB/s on the H200 and leave the other
    # SMs to the work beside them)
    gather_programs: int = 16
    # the KV pool's dtype: "auto" (the model's) or "fp8" (float8 e4m3, kernels.fp8: half the
    # bytes of bf16 in both tiers, the host fetches and host memory; the tiered cache only)
    kv_dtype: str = "auto"
    # a RoPE scaling that stretches the model's window (ModelConfig.with_rope_scaling), as
    # vLLM's --rope-scaling; None: the model's own
    rope_scaling: dict[str, Any] | None = None
    # where converted checkpoints and model-check stamps are kept (engine.loading.paths);
    # None: ~/.cache/agentctx. The application passes its own (agentctx.app_paths)
    cache_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.kv_dtype not in ("auto", "fp8"):
            raise ValueError(f"kv_dtype must be auto or fp8, got {self.kv_dtype!r}")
        if self.kv_dtype == "fp8" and self.sparse is None:
            raise ValueError("kv_dtype fp8 is for the tiered cache: it needs sparse decode")
        if self.tier_alloc not in ("triton", "torch"):
            raise ValueError(f"tier_alloc must be triton or torch, got {self.tier_alloc!r}")
        if isinstance(self.gather_programs, bool) or not isinstance(self.gather_programs, int):
            raise ValueError(f"gather_programs must be an integer, got {self.gather_programs!r}")
        if self.gather_programs < 1:
            raise ValueError(f"gather_programs must be >= 1, got {self.gather_programs}")
