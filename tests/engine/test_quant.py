"""Quantized weights: the GGUF converter's Q4 and Q8 arrays, Int4Linear, Int8Linear, and
load_quantized end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from engine import Engine, EngineConfig, SamplingParams
from engine.loading.gguf_checkpoint import Q4_FILE, Q8_FILE, gguf_to_checkpoint
from engine.loading.gguf_quants import int8_rows
from engine.loading.loader import (
    build_model,
    load_checkpoint_weights,
    load_tokenizer,
    read_config,
    resolve_source,
)
from engine.loading.quant import (
    GROUP_SIZE,
    Int4Linear,
    Int8Linear,
    load_quantized,
    quantize_lm_head,
)
from engine.runtime.llm_engine import prompt_logits

gguf = pytest.importorskip("gguf")

LINEARS = [f"self_attn.{x}_proj" for x in "qkvo"] + [
    f"mlp.{x}_proj" for x in ("gate", "up", "down")
]


def _random_q4(N: int, K: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    scale = torch.rand(N, K // GROUP_SIZE, generator=g) * 0.02 + 0.001
    zero = -8 * scale + 0.01 * torch.randn(N, K // GROUP_SIZE, generator=g)
    return q, scale, zero


def _dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """The file's convention: W[n, k] = q[n, k] * scale[n, k // 32] + zero[n, k // 32]."""
    N, K = q.shape
    w = q.float().view(N, -1, GROUP_SIZE) * scale[..., None] + zero[..., None]
    return w.view(N, K)


def _bf16_error_bound(x: torch.Tensor, w: torch.Tensor) -> float:
    # bf16 keeps 8 significant bits: x, the scales and the zeros are each rounded by at most
    # 2^-9 relative; the errors add up over K terms at worst like sum |x| |w|.
    return 3 * 2**-9 * (x.abs() @ w.abs().T).max().item() + 1e-4


# ---- Int4Linear ----------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 7])
@pytest.mark.parametrize(("N", "K", "bias"), [(96, 160, False), (40, 64, True)])
def test_int4_linear_matches_the_dequantized_weight(T: int, N: int, K: int, bias: bool) -> None:
    q, scale, zero = _random_q4(N, K)
    w = _dequantize(q, scale, zero)
    b = torch.randn(N) if bias else None
    layer = Int4Linear(q, scale, zero, b)  # N = 40 is padded to 48 rows inside
    x = torch.randn(T, K)
    with torch.inference_mode():
        got, want = layer(x), F.linear(x, w, b)
    assert got.shape == (T, N) and got.dtype == torch.float32
    assert (got - want).abs().max().item() <= _bf16_error_bound(x, w)
    # and not merely loose: the error is bf16-sized, far below the outputs' spread
    assert (got - want).abs().max().item() < 0.02 * want.abs().max().item()


def test_int4_linear_dense_path_for_long_inputs() -> None:
    q, scale, zero = _random_q4(64, 96)
    w, b = _dequantize(q, scale, zero), torch.randn(64)
    layer = Int4Linear(q, scale, zero, b, dense=w, max_tokens=4)
    short, long = torch.randn(4, 96), torch.randn(2, 5, 96)  # leading dims are flattened
    with torch.inference_mode():
        assert torch.equal(layer(long), F.linear(long, w, b))  # exactly the dense weight
        got = layer(short)
    assert not torch.equal(got, F.linear(short, w, b))  # bf16 kernel: close, not equal
    assert (got - F.linear(short, w, b)).abs().max().item() <= _bf16_error_bound(short, w)


def test_int4_linear_rejects_bad_shapes() -> None:
    q, scale, zero = _random_q4(32, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        Int4Linear(q[:, :48], scale, zero)
    with pytest.raises(ValueError, match="dense weight"):
        Int4Linear(q, scale, zero, dense=torch.zeros(32, 32))


# ---- Int8Linear ----------------------------------------------------------------------------


def _random_int8(N: int, K: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * (0.02 + 0.05 * torch.rand(N, 1, generator=g))
    q, scale = map(torch.from_numpy, int8_rows(w.numpy()))
    return q, scale, q.float() * scale[:, None]  # the kernel's weight, exactly


@pytest.mark.parametrize("T", [1, 7])
@pytest.mark.parametrize(("N", "K", "bias"), [(96, 160, False), (1001, 64, True)])
def test_int8_linear_matches_its_weight(T: int, N: int, K: int, bias: bool) -> None:
    q, scale, w = _random_int8(N, K)
    b = torch.randn(N) if bias else None
    layer = Int8Linear(q, scale, b)
    x = torch.randn(T, K)
    with torch.inference_mode():
        got, want = layer(x), F.linear(x, w, b)
    assert got.shape == (T, N) and got.dtype == torch.float32
    # bf16 activations and a bf16 output: errors of bf16 size, far below the outputs' spread
    assert (got - want).abs().max().item() <= _bf16_error_bound(x, w) + 2**-8 * want.abs().max()
    assert (got - want).abs().max().item() < 0.02 * want.abs().max().item()


def test_int8_linear_dense_path_and_misaligned_inputs() -> None:
    q, scale, w = _random_int8(64, 96)
    b = torch.randn(64)
    layer = Int8Linear(q, scale, b, dense=w, max_tokens=4)
    long = torch.randn(2, 5, 96)
    with torch.inference_mode():
        assert torch.equal(layer(long), F.linear(long, w, b))  # exactly the dense weight
        # a bf16 view 2 bytes into its buffer: the kernel loads 16-byte aligned rows
        buf = torch.randn(3 * 96 + 1).to(torch.bfloat16)
        x = buf[1:].view(3, 96)
        assert x.data_ptr() % 16
        assert torch.equal(layer(x), layer(x.clone()))


def test_int8_linear_takes_rows_and_inputs_at_any_alignment() -> None:
    """The kernel's AVX-512 build reads weights and activations 64-byte aligned: a stored
    head's rows 4 bytes past a line, or an activation 16 bytes past one, segfaulted there. In
    a child process, so that a crash fails this test and not the run."""
    code = """
import torch
from engine.loading.quant import Int8Linear
qbuf = torch.randint(-127, 127, (101 * 256 + 4,), dtype=torch.int8)
q = qbuf[4:].view(101, 256)
assert q.data_ptr() % 64
sbuf = torch.rand(101 + 8).to(torch.bfloat16)
layer = Int8Linear(q, sbuf[8:])
for off in (0, 8, 16, 24):
    xbuf = torch.randn(3 * 256 + 32).to(torch.bfloat16)
    x = xbuf[off : off + 3 * 256].view(3, 256)
    want = x.float() @ (q.float() * sbuf[8:].float()[:, None]).T
    got = layer(x).float()
    assert (got - want).abs().max() <= 0.02 * want.abs().max(), off
print("ok")
"""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_quantized_kernels_are_row_independent(kind: str) -> None:
    """What verification steps rely on (engine.models.causal_lm.row_exact): a row's output does not
    depend on the rows computed with it."""
    if kind == "int4":
        q, scale, zero = _random_q4(80, 128)
        layer = Int4Linear(q, scale, zero, torch.randn(80), dense=torch.randn(80, 128))
    else:
        q, scale, _ = _random_int8(80, 128)
        layer = Int8Linear(q, scale, torch.randn(80), dense=torch.randn(80, 128))
    x = torch.randn(45, 128)
    with torch.inference_mode():
        rows = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
        assert torch.equal(layer(x, kernel_rows=len(x)), rows)
        assert not torch.equal(layer(x), rows)  # 45 rows > max_tokens: the dense weight


def test_int8_linear_rejects_bad_shapes() -> None:
    q, scale, _ = _random_int8(32, 64)
    with pytest.raises(ValueError, match="multiple of 8"):
        Int8Linear(q[:, :60], scale)
    with pytest.raises(ValueError, match="bad int8 weight"):
        Int8Linear(q, scale[:31])
    with pytest.raises(ValueError, match="dense weight"):
        Int8Linear(q, scale, dense=torch.zeros(32, 32))


# ---- tiny synthetic GGUFs: Q4_1 (llama, permuted q/k) and Q4_0 (qwen2, qkv bias) -----------


def _load(directory: Path):
    """The engine's own fp32 CPU model of a checkpoint directory: (model, config, source)."""
    source = resolve_source(str(directory))
    cfg = read_config(source)
    model = build_model(cfg, torch.device("cpu"), torch.float32)
    load_checkpoint_weights(model, source.path)
    return model, cfg, source


@pytest.mark.parametrize(
    ("arch", "qtype"),
    [("llama", gguf.GGMLQuantizationType.Q4_1), ("qwen2", gguf.GGMLQuantizationType.Q4_0)],
    ids=["llama-q4_1", "qwen2-q4_0"],
)
def test_tiny_gguf_q4_arrays_and_int4_model(tmp_path: Path, arch: str, qtype: int) -> None:
    from tests.engine.test_gguf import _tiny_model, _write_gguf

    src = tmp_path / f"tiny-{arch}.gguf"
    _write_gguf(src, arch, _tiny_model(arch, tied=False), qtype)
    out = gguf_to_checkpoint(src, cache_root=tmp_path / "cache")
    dense, q4 = load_file(out / "model.safetensors"), load_file(out / Q4_FILE)
    for i in range(2):
        for lin in LINEARS:
            base = f"model.layers.{i}.{lin}"
            q, scale, zero = (q4[f"{base}.{p}"] for p in ("q", "scale", "zero"))
            assert q.dtype == torch.uint8 and int(q.max()) <= 15
            assert torch.equal(_dequantize(q, scale, zero), dense[f"{base}.weight"]), base
    assert not any(k.startswith(("model.embed_tokens", "lm_head")) for k in q4)

    reference, cfg, _ = _load(out)
    model, _, _ = _load(out)
    assert load_quantized(model, out, dense_dtype=None) == 4 * cfg.num_layers
    attn = model.layers[0].self_attn
    assert isinstance(attn.qkv_proj, Int4Linear) and attn.qkv_proj.dense is None
    assert (attn.qkv_proj.bias is not None) == (arch == "qwen2")  # Qwen2's qkv bias is kept
    if arch == "qwen2":
        assert torch.equal(attn.qkv_proj.bias, reference.layers[0].self_attn.qkv_proj.bias)
    ids = [1, 10, 40, 70, 99, 5, 2, 33]
    engines = [Engine(m, cfg, None, EngineConfig(), name=arch) for m in (reference, model)]
    want, got = (prompt_logits(e, ids) for e in engines)
    assert (got - want).abs().max().item() < 0.05 * want.abs().max().item()


def test_load_quantized_all_or_nothing(tmp_path: Path) -> None:
    from tests.engine.test_gguf import _tiny_model, _write_gguf

    src = tmp_path / "tiny.gguf"
    _write_gguf(src, "llama", _tiny_model("llama", tied=True), gguf.GGMLQuantizationType.Q4_1)
    out = gguf_to_checkpoint(src, cache_root=tmp_path / "cache")
    model, _, _ = _load(out)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    q4 = load_file(out / Q4_FILE)
    save_file({k: v for k, v in q4.items() if ".1.mlp.down_proj." not in k}, out / Q4_FILE)
    assert load_quantized(model, out) == 0  # one weight without a 4-bit form: no change
    (out / Q4_FILE).unlink()
    assert load_quantized(model, out) == 0  # no file (e.g. an F16 GGUF)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert not any(isinstance(m, Int4Linear) for m in model.modules())

    model.to_empty(device="meta")  # stands in for a CUDA model on a CPU-only machine
    with pytest.raises(ValueError, match="CPU only"):
        load_quantized(model, out)


def test_a_q8_0_gguf_runs_int8_linears(tmp_path: Path) -> None:
    from tests.engine.test_gguf import _tiny_model, _write_gguf

    src = tmp_path / "tiny.gguf"
    _write_gguf(src, "qwen3", _tiny_model("qwen3", tied=True), gguf.GGMLQuantizationType.Q8_0)
    out = gguf_to_checkpoint(src, cache_root=tmp_path / "cache")
    assert (out / "model.safetensors").is_file() and not (out / Q4_FILE).exists()
    dense, q8 = load_file(out / "model.safetensors"), load_file(out / Q8_FILE)
    assert {k.rsplit(".", 1)[0] for k in q8} == {  # the linears and the tied head
        f"model.layers.{i}.{lin}" for i in range(2) for lin in LINEARS
    } | {"model.embed_tokens"}
    for base in ("model.layers.1.self_attn.k_proj", "model.embed_tokens"):
        q, scale = q8[f"{base}.q"], q8[f"{base}.scale"]
        err = (q.float() * scale[:, None] - dense[f"{base}.weight"]).abs().amax(dim=1)
        assert (err <= scale / 2).all()

    reference, cfg, _ = _load(out)
    model, _, _ = _load(out)
    assert load_quantized(model, out, dense_dtype=None) == 4 * cfg.num_layers
    quantize_lm_head(model, out)
    assert isinstance(model.layers[1].mlp.gate_up_proj, Int8Linear)
    assert torch.equal(model.int8_head.q, q8["model.embed_tokens.q"])
    ids = [1, 10, 40, 70, 99, 5, 2, 33]
    engines = [Engine(m, cfg, None, EngineConfig(), name="q8") for m in (reference, model)]
    want, got = (prompt_logits(e, ids) for e in engines)
    assert (got - want).abs().max().item() < 0.05 * want.abs().max().item()


# ---- the default model (SmolLM2-135M-Instruct, Q4_1) ----------------------------------------


@pytest.fixture(scope="module")
def checkpoint(default_checkpoint: tuple[Path, Path]) -> Path:
    return default_checkpoint[0]


@pytest.mark.slow
def test_default_model_q4_arrays_reproduce_the_weights(checkpoint: Path) -> None:
    from engine.loading.default_model import default_model_path
    from engine.loading.gguf_weights import unpermute

    dense, q4 = load_file(checkpoint / "model.safetensors"), load_file(checkpoint / Q4_FILE)
    assert len(q4) == 30 * len(LINEARS) * 3
    for key, w in dense.items():
        if not key.endswith("_proj.weight"):
            continue
        base = key.removesuffix(".weight")
        q, scale, zero = (q4[f"{base}.{p}"] for p in ("q", "scale", "zero"))
        assert q.dtype == torch.uint8 and q.shape == w.shape and int(q.max()) <= 15
        assert scale.dtype == zero.dtype == torch.float32
        assert scale.shape == zero.shape == (w.shape[0], w.shape[1] // GROUP_SIZE)
        assert torch.equal(_dequantize(q, scale, zero), w), key  # bit for bit

    # and both equal gguf's own dequantization (un-permuted for llama's q/k)
    reader = gguf.GGUFReader(default_model_path())
    names = {
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "ffn_down": "mlp.down_proj",
    }
    heads = {"attn_q": 9, "attn_k": 3}
    for t in reader.tensors:
        parts = t.name.split(".")
        if parts[0] != "blk" or parts[1] not in ("0", "29") or parts[2] not in names:
            continue
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        if parts[2] in heads:
            ref = unpermute(ref, heads[parts[2]])
        assert torch.equal(
            dense[f"model.layers.{parts[1]}.{names[parts[2]]}.weight"], torch.from_numpy(ref)
        )


@pytest.mark.slow
def test_default_model_int4_logits_and_decode_speed(checkpoint: Path) -> None:
    reference, cfg, source = _load(checkpoint)
    tokenizer = load_tokenizer(source)
    int4, _, _ = _load(checkpoint)
    assert load_quantized(int4, checkpoint, dense_dtype=None) == 4 * 30
    hybrid, _, _ = _load(checkpoint)
    assert load_quantized(hybrid, checkpoint) == 4 * 30  # dense fp32 kept for prefill
    engines = {
        name: Engine(m, cfg, tokenizer, EngineConfig(), name=name)
        for name, m in (("fp32", reference), ("int4", int4), ("int4+fp32", hybrid))
    }
    reply = (
        "A hash table maps keys to values through a hash function, giving constant-time "
        "lookups on average. Use one for fast membership tests, counting, caching and "
        "indexing records by an identifier."
    )
    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Explain what a hash table is and when to use one."},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
    ]
    ids = engines["fp32"].chat_tokens(messages)
    want = prompt_logits(engines["fp32"], ids)
    got = prompt_logits(engines["int4"], ids)  # every position through the int4 kernel
    diff = (got - want).abs().max().item()
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    print(
        f"\n{len(ids)} positions: int4 vs fp32 logits max abs diff {diff:.3f} "
        f"(fp32 logits span {want.min().item():.1f}..{want.max().item():.1f}), "
        f"top-1 agreement {agree:.1%}"
    )
    # bf16 activations and bf16-rounded scales shift logits by ~0.5 here (max over 93
    # positions; they span ~70); where the argmax differs the two best tokens are tied to
    # within 0.05 (measured: 2 of 93 positions, margins 0.03 and 0.04).
    assert agree >= 0.95
    assert diff < 3.0
    best = want.max(-1).values
    picked = want.gather(-1, got.argmax(-1, keepdim=True)).squeeze(-1)
    assert (best - picked).max().item() < 0.25  # int4's choice is (near) fp32's best
    # chunks above 32 tokens take the kept fp32 weight: exactly the fp32 model's logits
    assert len(ids) > 32 and torch.equal(prompt_logits(engines["int4+fp32"], ids), want)

    params = SamplingParams(max_tokens=31, ignore_eos=True)  # 30 decode steps
    answer = engines["int4"].generate([ids], SamplingParams(max_tokens=20))[0].text
    assert "Paris" in answer, answer
    ms = {name: [] for name in engines}
    for _ in range(3):  # other processes share the CPUs: report the best of three
        for name, engine in engines.items():
            stats = engine.generate([ids], params)[0].stats
            ms[name].append(1000 / stats.decode_tok_s)
    print("decode ms/token (best of 3): " + ", ".join(f"{n} {min(v):.1f}" for n, v in ms.items()))
    # timing is reported, never asserted: shared CPUs make it too noisy
