"""K-quant GGUFs (Q4_K, Q5_0, Q5_K, Q6_K, Q8_0): the block decoders against gguf's own
dequantization, the quantized CPU path on a tiny mixed-type GGUF, and (slow) the real
Qwen2.5-Coder-0.5B Q4_K_M: the exact mode against transformers, the quantized mode's top-1
agreement with the exact one."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine import Engine, EngineConfig, EngineError
from engine.loading.gguf_checkpoint import Q4_FILE, Q8_FILE, gguf_to_checkpoint
from engine.loading.gguf_quants import GROUP, dequantize, dequantize_int4, int8_rows
from engine.loading.loader import (
    build_model,
    load_checkpoint_weights,
    load_tokenizer,
    read_config,
    resolve_source,
)
from engine.loading.quant import Int4Linear, Int8Linear, load_quantized, quantize_lm_head
from engine.runtime.llm_engine import prompt_logits

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType

# Where each type keeps its fp16 fields, and the size of those that give weights of ~0.05.
_HALVES = {
    "Q4_0": {0: 0.01},
    "Q4_1": {0: 0.005, 2: -0.04},
    "Q5_0": {0: 0.004},
    "Q5_1": {0: 0.002, 2: -0.03},
    "Q8_0": {0: 0.0005},
    "Q4_K": {0: 1e-4, 2: 1e-3},
    "Q5_K": {0: 5e-5, 2: 1e-3},
    "Q6_K": {-2: 2e-5},
}


def random_blocks(name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, bytes per row]: random bytes, with sane random fp16 scales (random bytes
    there would hold infs and NaNs)."""
    block, block_bytes = gguf.GGML_QUANT_SIZES[T[name]]
    raw = rng.integers(0, 256, (rows, cols // block, block_bytes), dtype=np.uint8)
    for at, size in _HALVES[name].items():
        at %= block_bytes
        half = (size * rng.uniform(0.2, 1.0, raw.shape[:2])).astype(np.float16)
        raw[..., at : at + 2] = half.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def reference(raw: np.ndarray, name: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, T[name])


# ---- the block decoders --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rows", "cols"),
    [("Q4_0", 7, 160), ("Q4_1", 5, 96), ("Q4_K", 3, 768), ("Q4_K", 1, 256)],
)
def test_int4_decoders_reproduce_gguf_bit_for_bit(name: str, rows: int, cols: int) -> None:
    raw = random_blocks(name, rows, cols, np.random.default_rng(cols + rows))
    weight, q, scale, zero = dequantize_int4(raw.reshape(-1), T[name], (rows, cols))
    ref = reference(raw, name)
    assert np.isfinite(ref).all() and ref.std() > 0.005
    assert np.array_equal(weight, ref)  # the fp32 reference is gguf's own maths
    assert q.dtype == np.uint8 and q.shape == (rows, cols) and q.max() == 15 and q.min() == 0
    assert scale.shape == zero.shape == (rows, cols // GROUP)
    grouped = q.reshape(rows, -1, GROUP).astype(np.float32) * scale[..., None] + zero[..., None]
    assert np.array_equal(grouped.reshape(rows, cols), ref)  # W = q * scale + zero, exactly


@pytest.mark.parametrize(
    ("name", "rows", "cols"),
    [("Q5_0", 7, 160), ("Q5_1", 3, 96), ("Q5_K", 5, 768), ("Q6_K", 3, 512), ("Q8_0", 9, 224)],
)
def test_int8_rows_of_5_to_8_bit_types(name: str, rows: int, cols: int) -> None:
    raw = random_blocks(name, rows, cols, np.random.default_rng(cols + rows))
    weight = dequantize(raw.reshape(-1), T[name], (rows, cols))
    ref = reference(raw, name)
    assert np.isfinite(ref).all() and ref.std() > 0.005
    assert np.array_equal(weight, ref)
    q, scale = int8_rows(weight)
    assert q.dtype == np.int8 and q.shape == (rows, cols) and scale.shape == (rows,)
    assert (np.abs(q).max(axis=1) == 127).all()  # each row uses the whole range
    bf16 = torch.from_numpy(scale).to(torch.bfloat16).float().numpy()
    assert np.array_equal(bf16, scale)  # the kernel's bf16 scales are these exactly
    err = np.abs(q.astype(np.float32) * scale[:, None] - ref).max(axis=1)
    assert (err <= scale * 0.5001).all()
    # and the rows are int8 of the weights, not something merely close: a step finer than
    # the file's own (for Q5_0, max |W[group]| / 16)
    assert (scale < np.abs(ref).max(axis=1) / 100).all()


def test_int8_rows_of_a_zero_row() -> None:
    w = np.zeros((2, 64), np.float32)
    w[1, 3] = -2.0
    q, scale = int8_rows(w)
    assert not q[0].any() and q[1, 3] == -127 and (q[1] != 0).sum() == 1
    assert np.isfinite(scale).all() and abs(q[1, 3] * scale[1] + 2.0) <= scale[1] / 2


# ---- a tiny qwen2 GGUF of mixed types --------------------------------------------------------

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 256, 512, 4, 2, 64, 2
# per layer: HF part -> GGUF type. Layer 0 fuses int4 (Q4_K) parts with an int8 one (Q6_K v)
# and runs its MLP in 4 bits; layer 1 is all 5-to-8-bit.
LAYER_TYPES = [
    {"q_proj": "Q4_K", "k_proj": "Q4_K", "v_proj": "Q6_K", "o_proj": "Q5_0",
     "gate_proj": "Q4_K", "up_proj": "Q4_K", "down_proj": "Q8_0"},
    {"q_proj": "Q5_0", "k_proj": "Q5_K", "v_proj": "Q8_0", "o_proj": "Q5_1",
     "gate_proj": "Q5_0", "up_proj": "Q5_0", "down_proj": "Q6_K"},
]  # fmt: skip
GGUF_PART = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}  # fmt: skip


def _shape(part: str) -> tuple[int, int]:
    return {"q_proj": (HEADS * HEAD_DIM, HIDDEN), "k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
            "v_proj": (KV_HEADS * HEAD_DIM, HIDDEN), "o_proj": (HIDDEN, HEADS * HEAD_DIM),
            "gate_proj": (INTER, HIDDEN), "up_proj": (INTER, HIDDEN),
            "down_proj": (HIDDEN, INTER)}[part]  # fmt: skip


def write_mixed_gguf(path: Path, embed: str = "Q5_0", head: str | None = "Q6_K") -> dict:
    """A qwen2 GGUF with LAYER_TYPES' linears (head None: tied embeddings; "F16" anywhere
    turns every linear into F16). Returns {GGUF tensor name: (type name, raw blocks)}."""
    from tests.engine.test_gguf import CHATML, MERGES, TOKENS

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(TOKENS)
    w.add_token_types([3, 3, 3] + [1] * (len(TOKENS) - 3))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHATML)
    tensors = {}

    def matrix(name: str, kind: str, rows: int, cols: int) -> None:
        if kind == "F16":
            data = (0.05 * rng.standard_normal((rows, cols))).astype(np.float16)
            w.add_tensor(name, data)
            tensors[name] = (kind, data)
            return
        raw = random_blocks(kind, rows, cols, rng)
        w.add_tensor(name, raw, raw_dtype=T[kind])
        tensors[name] = (kind, raw)

    def vector(name: str, n: int, base: float) -> None:
        w.add_tensor(name, (base + 0.05 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", embed, len(TOKENS), HIDDEN)
    for i, types in enumerate(LAYER_TYPES):
        vector(f"blk.{i}.attn_norm.weight", HIDDEN, 1.0)
        vector(f"blk.{i}.ffn_norm.weight", HIDDEN, 1.0)
        for part, kind in types.items():
            matrix(f"blk.{i}.{GGUF_PART[part]}.weight", "F16" if embed == "F16" else kind,
                   *_shape(part))  # fmt: skip
        for part in ("q_proj", "k_proj", "v_proj"):  # Qwen2's qkv bias
            vector(f"blk.{i}.{GGUF_PART[part]}.bias", _shape(part)[0], 0.0)
    vector("output_norm.weight", HIDDEN, 1.0)
    if head is not None:
        matrix("output.weight", head, len(TOKENS), HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def _load(directory: Path):
    source = resolve_source(str(directory))
    cfg = read_config(source)
    model = build_model(cfg, torch.device("cpu"), torch.float32)
    load_checkpoint_weights(model, source.path)
    return model, cfg


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(GGUF, its converted checkpoint, its tensors)"""
    root = tmp_path_factory.mktemp("mixed")
    src = root / "mixed.gguf"
    tensors = write_mixed_gguf(src)
    return src, gguf_to_checkpoint(src, cache_root=root / "cache"), tensors


def test_mixed_gguf_converts_to_exact_weights_and_their_quantized_forms(mixed) -> None:
    _, out, tensors = mixed
    dense, q4, q8 = (load_file(out / f) for f in ("model.safetensors", Q4_FILE, Q8_FILE))
    for i, types in enumerate(LAYER_TYPES):
        for part, kind in types.items():
            hf = f"model.layers.{i}.{'self_attn' if part[0] in 'qkvo' else 'mlp'}.{part}"
            _, raw = tensors[f"blk.{i}.{GGUF_PART[part]}.weight"]
            want = torch.from_numpy(reference(raw, kind))
            assert torch.equal(dense[f"{hf}.weight"], want), hf  # the exact reference
            if kind == "Q4_K":
                assert f"{hf}.q" not in q8
                q, scale, zero = (q4[f"{hf}.{p}"].float() for p in ("q", "scale", "zero"))
                w = q.view(q.shape[0], -1, GROUP) * scale[..., None] + zero[..., None]
                assert torch.equal(w.view(want.shape), want), hf
            else:
                assert f"{hf}.q" not in q4
                q, scale = q8[f"{hf}.q"], q8[f"{hf}.scale"]
                assert q.dtype == torch.int8 and scale.shape == (want.shape[0],)
                err = (q.float() * scale[:, None] - want).abs().amax(dim=1)
                assert (err <= scale * 0.5001).all(), hf
    # the output head (Q6_K) has int8 rows; the embedding, untied, has none
    assert q8["lm_head.q"].shape == dense["lm_head.weight"].shape
    assert not any(k.startswith("model.embed_tokens") for k in (*q4, *q8))


def test_mixed_gguf_quantized_linears_and_logits(mixed) -> None:
    _, out, _ = mixed
    reference_model, cfg = _load(out)
    model, _ = _load(out)
    assert load_quantized(model, out, dense_dtype=None) == 4 * LAYERS
    quantize_lm_head(model, out)
    kinds = [[type(getattr(getattr(layer, p), m)) for p, m in
              (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"),
               ("mlp", "down_proj"))] for layer in model.layers]  # fmt: skip
    # layer 0: Q4_K q/k with a Q6_K v run as int8; Q4_K gate/up as int4
    assert kinds[0] == [Int8Linear, Int8Linear, Int4Linear, Int8Linear]
    assert kinds[1] == [Int8Linear] * 4
    assert isinstance(model.int8_head, Int8Linear)
    # the stored head rows are what requantizing the fp32 head gives
    q, scale = map(torch.from_numpy, int8_rows(reference_model.lm_head.weight.detach().numpy()))
    assert torch.equal(model.int8_head.q, q) and torch.equal(model.int8_head.scale.float(), scale)

    ids = [1, 10, 40, 70, 99, 5, 2, 33, 60, 61, 62, 12, 90, 91, 3, 4] * 3
    engines = [Engine(m, cfg, None, EngineConfig(), name="mixed") for m in (reference_model, model)]
    want, got = (prompt_logits(e, ids) for e in engines)  # every row through the kernels
    span = want.abs().max().item()
    assert span > 1.0
    assert (got - want).abs().max().item() < 0.05 * span
    best = want.max(-1).values
    picked = want.gather(-1, got.argmax(-1, keepdim=True)).squeeze(-1)
    assert (best - picked).max().item() < 0.02 * span  # where top-1 differs, a near-tie


def test_mixed_gguf_engine_modes(mixed, tmp_path: Path) -> None:
    src, _, _ = mixed
    fast = Engine.load(str(src), device="cpu", weights="auto")
    assert fast.weights_mode == "int4"
    exact = Engine.load(str(src), device="cpu", weights="dense")
    assert exact.weights_mode == "dense" and exact.model.int8_head is None
    every = Engine.load(str(src), device="cpu", weights="int4-all")
    assert every.weights_mode == "int4-all"
    kinds = {type(m).__name__ for m in every.model.layers.modules()}
    assert "Int4Linear" in kinds and "Int8Linear" not in kinds
    assert "Int8Linear" in {type(m).__name__ for m in fast.model.layers.modules()}
    with pytest.raises(EngineError, match="unknown weights mode 'int3'.*int4-all"):
        Engine.load(str(src), device="cpu", weights="int3")

    f16 = tmp_path / "f16.gguf"
    write_mixed_gguf(f16, embed="F16", head="F16")
    assert Engine.load(str(f16), device="cpu", weights="auto").weights_mode == "dense"
    for mode in ("int4", "int4-all"):
        with pytest.raises(EngineError, match="no quantized weights.*Q4_K.*Q6_K"):
            Engine.load(str(f16), device="cpu", weights=mode)


# ---- the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M ----------------------------------------------

QWEN = "qwen2.5-coder-0.5b"
TEXT = Path(__file__).resolve().parent / "data" / "readme_excerpt.md"  # prose and code


def qwen_gguf_files() -> list[Path]:
    """The model's file (AGENTCTX_TEST_QWEN_GGUF, else the installed known model's parts)."""
    if path := os.environ.get("AGENTCTX_TEST_QWEN_GGUF"):
        if not Path(path).is_file():
            pytest.skip(f"AGENTCTX_TEST_QWEN_GGUF={path} is not a file")
        return [Path(path)]
    from engine.loading import model_catalog

    known = model_catalog.lookup(QWEN)
    if known is None or not model_catalog.is_installed(known):
        pytest.skip(f"{QWEN} is not installed (agentctx models install {QWEN})")
    return model_catalog.verified_files(known)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> tuple[list[Path], Path]:
    """(the GGUF's files, its converted checkpoint in the session's cache)"""
    from agentctx.app_paths import cache_dir

    files = qwen_gguf_files()
    return files, gguf_to_checkpoint(files if len(files) > 1 else files[0],
                                     cache_root=cache_dir() / "gguf")  # fmt: skip


@pytest.mark.slow
def test_qwen_exact_mode_matches_transformers(qwen, tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    files, checkpoint = qwen
    if len(files) == 1:
        gguf_path = files[0]
    else:  # transformers reads one file: join the parts
        gguf_path = tmp_path / "model.gguf"
        with open(gguf_path, "wb") as out:
            for f in files:
                out.write(f.read_bytes())
    # what from_pretrained(gguf_file=...) does, without the accelerate package it insists on
    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    state = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=hf)
    missing, unexpected = hf.load_state_dict(state["tensors"], strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    engine = Engine.load(str(checkpoint), device="cpu", weights="dense")
    assert engine.weights_mode == "dense"
    ids = engine.tokenizer.encode("def quicksort(xs):\n    # sort a list of numbers\n")
    got = prompt_logits(engine, ids)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    print(f"\n{len(ids)} positions: max |logit diff| {diff:.2e}, logits up to {scale:.1f}")
    assert diff < 1e-4 * scale
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.slow
@pytest.mark.parametrize(
    "all_int4, agreement, given_up",
    [(False, 0.9, 0.1), (True, 0.85, 0.2)],
    ids=["int4", "int4-all"],
)
def test_qwen_quantized_mode_agrees_with_the_exact_mode(qwen, all_int4, agreement, given_up):
    _, checkpoint = qwen
    exact, cfg = _load(checkpoint)
    model, _ = _load(checkpoint)
    assert load_quantized(model, checkpoint, None, all_int4) == 4 * cfg.num_layers
    quantize_lm_head(model, checkpoint)
    kinds = {type(m).__name__ for m in model.layers.modules()}
    # this file has both kinds; int4-all requantizes the 5- to 8-bit ones to 4-bit groups
    assert kinds >= {"Int4Linear"} and ("Int8Linear" in kinds) != all_int4

    tok = load_tokenizer(resolve_source(str(checkpoint)))
    ids = tok.encode(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)[:320]
    engines = [Engine(m, cfg, tok, EngineConfig(), name=QWEN) for m in (exact, model)]
    want, got = (prompt_logits(e, ids) for e in engines)  # no dense weights: every position
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()  # goes through kernels
    best = want.max(-1).values
    picked = want.gather(-1, got.argmax(-1, keepdim=True)).squeeze(-1)
    loss = (best - picked).mean().item()
    print(f"\n{len(ids)} teacher-forced positions of {TEXT.name}: top-1 agreement "
          f"{agree:.1%}, mean logit given up {loss:.3f}")  # fmt: skip
    assert agree >= agreement
    assert loss < given_up
