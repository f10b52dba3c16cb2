"""agentctx's embedded inference engine. Imports torch, transformers and safetensors only."""

import kernels as _kernels
from engine.errors import KernelsShadowedError

if not hasattr(_kernels, "HAS_TRITON"):  # another distribution's top-level `kernels`
    raise KernelsShadowedError(
        f"the `kernels` package at {getattr(_kernels, '__file__', None) or '?'} is not "
        "agentctx's: Hugging Face's `kernels` distribution (which transformers 5.25 and later "
        "require) takes its place; run `pip uninstall kernels` and install transformers<5.25"
    )

from engine.config import EngineConfig, ModelConfig  # noqa: E402
from engine.errors import (
    ContextTooLongError,
    EngineError,
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from engine.runtime.llm_engine import Engine
from engine.runtime.requests import Completion, GenerationStats, Stream, StreamEvent
from engine.sampling_params import SamplingParams

__all__ = [
    "Completion",
    "ContextTooLongError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "GenerationStats",
    "ModelConfig",
    "ModelLoadError",
    "ModelNotFoundError",
    "SamplingParams",
    "Stream",
    "StreamEvent",
    "UnsupportedModelError",
]
