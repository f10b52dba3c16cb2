"""4-bit weights for the GPU (engine.loading.gpu_int4): a model's linears replaced by
W4A16Linear compute what the model computes with those 4-bit weights dequantized, from a
GGUF's own blocks (SmolLM2's Q4_1, Q8_0 parts fitted) or fitted from float weights; the
kernel runs through the Triton interpreter here (the torch reference where triton is
absent), and each row's result does not depend on the other rows (verification)."""

from __future__ import annotations

import pytest
import torch

from engine import Engine
from engine.loading.gpu_int4 import W4A16Linear, load_gpu_int4
from engine.runtime.llm_engine import prompt_logits
from kernels import HAS_TRITON
from kernels.w4a16 import dequantize


def dequantized_copy(engine: Engine) -> Engine:
    """The same model loaded densely, its linears set to the W4A16 ones' dequantized weights."""
    other = Engine.load(None, device="cpu", dtype="float32", weights="dense")
    for mine, theirs in zip(engine.model.layers, other.model.layers, strict=True):
        for parent_name in ("self_attn", "mlp"):
            for name, mod in getattr(mine, parent_name).named_children():
                if isinstance(mod, W4A16Linear):
                    dense = getattr(getattr(theirs, parent_name), name)
                    dense.weight.data.copy_(dequantize(mod.packed, mod.scale, mod.zero))
    return other


@pytest.fixture(scope="module")
def quantized():
    engine = Engine.load(None, device="cpu", dtype="float32", weights="dense")
    from engine.loading.loader import resolve_source

    n = load_gpu_int4(engine.model, resolve_source(None).path)
    return engine, n


def test_every_layer_linear_is_replaced(quantized):
    engine, n = quantized
    assert n == 4 * len(engine.model.layers)
    assert all(isinstance(layer.mlp.down_proj, W4A16Linear) for layer in engine.model.layers)


def test_logits_equal_the_dequantized_model(quantized):
    engine, _ = quantized
    ids = engine.encode("def add(a, b):\n    return a + b\n\nprint(add(2, 3))")
    ours = prompt_logits(engine, ids)
    ref = prompt_logits(dequantized_copy(engine), ids)
    assert (ours - ref).abs().max().item() < 2e-3


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_rows_do_not_depend_on_each_other():
    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.05
    from engine.loading.int4_groups import int4_groups

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # (the interpreter on a CPU)
    lin = W4A16Linear(*int4_groups(w), None, torch.float32).to(dev)
    x = torch.randn(9, 128).to(dev)
    from kernels.w4a16 import w4a16

    together = w4a16(x, lin.packed, lin.scale, lin.zero, use_triton=True)
    alone = torch.cat([w4a16(x[i : i + 1], lin.packed, lin.scale, lin.zero, use_triton=True)
                       for i in range(9)])  # fmt: skip
    if dev == "cpu":  # the interpreter: bit for bit (the CPU's verification relies on it)
        assert torch.equal(together, alone)
    else:  # a GPU compiles one kernel per row block (its sums may differ in the last bits)
        torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
