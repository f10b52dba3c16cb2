"""Garbage checkpoint directories: a config.json whose sizes are 0, negative, strings or
absurd, or a model.safetensors that is not one. `ask --model DIR` prints one line naming
what is wrong and exits 1, never a traceback (0 attention heads divided by zero, a corrupt
safetensors raised SafetensorError); in-process, the loader raises the engine's own
errors by name."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine import Engine, EngineError, ModelLoadError
from engine.config import ModelConfig
from tests.app.test_cli import agentctx, assert_one_line_error
from tests.reliability.snapshot_support import TINY

SIZES = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"]  # fmt: skip
BAD_SIZES = [0, -1, "64", 64.0, True, [64], {"n": 64}, 1 << 40]


def checkpoint(directory: Path, config: dict, weights: bytes | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    if weights is not None:
        (directory / "model.safetensors").write_bytes(weights)
    return directory


def refused(config: dict, *needles: str) -> str:
    with pytest.raises(EngineError) as e:
        ModelConfig.from_hf(config)
    message = str(e.value)
    assert "\n" not in message and all(n in message for n in needles), message
    return message


@pytest.mark.parametrize("value", BAD_SIZES, ids=repr)
@pytest.mark.parametrize("field", SIZES)
def test_a_size_that_is_not_a_positive_whole_number_is_refused_by_name(field, value):
    refused({**TINY, field: value}, field)


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "intermediate_size",
                                   "num_hidden_layers", "num_attention_heads"])  # fmt: skip
def test_a_missing_size_is_refused_by_name(field):
    refused({k: v for k, v in TINY.items() if k != field}, "missing", field)


def test_fewer_hidden_units_than_heads_is_refused():
    refused({**TINY, "hidden_size": 2}, "hidden_size 2", "num_attention_heads 4")


@pytest.mark.parametrize("field,value", [
    ("rms_norm_eps", "1e-5"), ("rms_norm_eps", 0), ("rms_norm_eps", -1e-5),
    ("rms_norm_eps", True), ("rms_norm_eps", float("nan")), ("rope_theta", "abc"),
    ("rope_theta", -5), ("rope_theta", [1]), ("eos_token_id", "2"), ("eos_token_id", [1, "x"]),
    ("eos_token_id", -1), ("eos_token_id", {"a": 1}), ("bos_token_id", 1.5),
    ("rope_scaling", {"rope_type": "linear", "factor": "8"}),
    ("rope_scaling", {"rope_type": "linear", "factor": True}),
])  # fmt: skip
def test_other_fields_of_the_wrong_type_are_refused_by_name(field, value):
    refused({**TINY, field: value}, field.split("_token")[0])


def test_a_good_tiny_config_still_loads(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TINY, "eos_token_id": [1, 2], "bos_token_id": 0}))
    engine = Engine.load(f"dummy:{config}", device="cpu", dtype="float32")
    assert engine.model_config.eos_token_ids == [1, 2]
    assert engine.model_config.bos_token_id == 0 and engine.model_config.head_dim == 8


def _safetensors(tmp_path: Path) -> bytes:
    path = tmp_path / "good.safetensors"
    save_file({"model.embed_tokens.weight": torch.zeros(128, 32)}, str(path))
    return path.read_bytes()


CORRUPT = {
    "empty": lambda good: b"",
    "random bytes": lambda good: bytes(range(256)) * 4,
    "a header length past the end": lambda good: struct.pack("<Q", 1 << 60) + b"{}",
    "cut in half": lambda good: good[: len(good) // 2],
    "not UTF-8": lambda good: struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc",
    "an unknown dtype": lambda good: good.replace(b'"F32"', b'"X32"'),
}


@pytest.mark.parametrize("how", list(CORRUPT))
def test_a_corrupt_safetensors_is_a_model_load_error(tmp_path, how):
    ck = checkpoint(tmp_path / "ck", TINY, CORRUPT[how](_safetensors(tmp_path)))
    with pytest.raises(ModelLoadError, match="cannot read .*model.safetensors") as e:
        Engine.load(str(ck), device="cpu", dtype="float32")
    assert "\n" not in str(e.value)


@pytest.fixture
def repo(tmp_path):
    from tests.reliability.support import make_repo

    return make_repo(tmp_path / "repo", {"README.md": "# r\n"})


def test_ask_with_a_corrupt_safetensors_prints_one_line(tmp_path, repo):
    ck = checkpoint(tmp_path / "ck", TINY, CORRUPT["random bytes"](b""))
    proc = agentctx("ask", "q", "--repo", str(repo), "--model", str(ck))
    assert_one_line_error(proc, "model.safetensors")


def test_ask_with_zero_attention_heads_prints_one_line(tmp_path, repo):
    config = {**TINY, "num_attention_heads": 0}
    del config["num_key_value_heads"]
    ck = checkpoint(tmp_path / "ck", config, _safetensors(tmp_path))
    proc = agentctx("ask", "q", "--repo", str(repo), "--model", str(ck))
    assert_one_line_error(proc, "num_attention_heads is 0")


def test_ask_with_a_string_for_a_size_prints_one_line(tmp_path, repo):
    ck = checkpoint(tmp_path / "ck", {**TINY, "hidden_size": "32"}, _safetensors(tmp_path))
    proc = agentctx("ask", "q", "--repo", str(repo), "--model", str(ck))
    assert_one_line_error(proc, "hidden_size is '32'")
    assert sorted(os.listdir(ck)) == ["config.json", "model.safetensors"]  # nothing written


def test_a_null_head_dim_with_fewer_hidden_units_than_heads_is_refused():
    refused({**TINY, "hidden_size": 2, "head_dim": None}, "hidden_size 2")


def test_a_huge_value_is_cut_short_in_the_message():
    assert len(refused({**TINY, "vocab_size": "9" * 5000}, "vocab_size")) < 200
