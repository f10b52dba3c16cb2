"""agentctx's embedded inference engine. Imports torch, transformers and safetensors only."""

from engine.loading.paths import keep_compiler_caches_inside

keep_compiler_caches_inside()  # nothing in the system temp folder or ~/.triton

from engine.config import EngineConfig, ModelConfig  # noqa: E402
from engine.errors import (  # noqa: E402
    ContextTooLongError,
    EngineError,
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from engine.runtime.llm_engine import Engine  # noqa: E402
from engine.runtime.requests import Completion, GenerationStats, Stream, StreamEvent  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

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
