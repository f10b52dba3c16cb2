from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig
from engine.loading.loader import build_model, load_checkpoint_weights, read_config, resolve_source


def tiny_checkpoint(tmp_path_factory, name: str, config) -> str:
    """Save a tiny random checkpoint with transformers itself; returns its directory."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    return str(path)


def load_engine(path: str, **cfg) -> Engine:
    source = resolve_source(path)
    mc = read_config(source)
    model = build_model(mc, torch.device("cpu"), torch.float32)
    load_checkpoint_weights(model, source.path)
    return Engine(model, mc, None, EngineConfig(**cfg), name=path)


@pytest.fixture
def engine_factory():
    return load_engine
