"""agentctx's embedded inference engine. Imports torch, transformers and safetensors only."""

from engine.config import EngineConfig, ModelConfig
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
