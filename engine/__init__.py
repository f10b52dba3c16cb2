"""agentctx's embedded inference engine. Imports torch, transformers and safetensors only."""

from engine.config import EngineConfig, ModelConfig
from engine.errors import (
    ContextTooLongError,
    EngineError,
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from engine.llm_engine import Completion, Engine, GenerationStats, Stream, StreamEvent
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
