"""The W4A16 linear (kernels.w4a16) against its torch reference: the Triton kernel in the
interpreter on CPU (on the GPU where there is one), odd row counts, split K, the prefill
fallback; and the packing round trip."""

from __future__ import annotations

import pytest
import torch

from kernels import HAS_TRITON
from kernels.w4a16 import (
    KERNELS,
    candidates,
    dequantize,
    launch,
    pack_int4,
    unpack_int4,
    w4a16,
    w4a16_reference,
)
from tests.triton_marks import DEVICE, needs_triton


def groups(n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = torch.rand(n, k // 32, generator=g) * 0.02 + 0.001
    zero = -8 * scale + torch.randn(n, k // 32, generator=g) * 0.001
    return q, scale, zero


def test_packing_round_trips_and_dequantizes_per_group():
    q, scale, zero = groups(5, 64)
    packed = pack_int4(q)
    assert packed.shape == (5, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), q)
    w = dequantize(packed, scale, zero)
    assert torch.allclose(w[2, 33], q[2, 33].float() * scale[2, 1] + zero[2, 1])


def first_of(kernel: str, n: int, k: int):
    """The kernel's first timed configuration."""
    return next(c for c in candidates(n, k, KERNELS) if c[4] == kernel)


@needs_triton
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("t,n,k", [(1, 40, 256), (3, 96, 512), (16, 33, 128), (5, 64, 1024)])
def test_kernel_matches_the_reference(kernel, dtype, t, n, k):
    q, scale, zero = groups(n, k, seed=t + n)
    packed = pack_int4(q).to(DEVICE)
    scale, zero = scale.to(dtype).to(DEVICE), zero.to(dtype).to(DEVICE)
    x = torch.randn(t, k, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    ours = launch(x, packed, scale, zero, first_of(kernel, n, k), t)
    ref = w4a16_reference(x, packed, scale, zero)
    assert ours.shape == (t, n) and ours.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), ref.float(), atol=tol, rtol=tol)
    if kernel == KERNELS[0] and DEVICE == "cpu":  # (a GPU times its own choice instead)
        assert torch.equal(w4a16(x, packed, scale, zero, use_triton=True), ours)


@needs_triton
def test_word_kernel_reads_every_nibble_at_every_slot_exactly():
    """Each of the 16 values at each of a word's 8 slots, against x of every size the
    activations take: the word kernel's floats 16 + q and 256 + q lose nothing that
    bf16 or fp16 keep (its fp32 result within 1e-5 of the exact one, relative; the byte
    kernel's within ~1e-7: the floats 256 + q give up 8 of fp32's 24 bits)."""
    k = 128
    q = torch.arange(16, dtype=torch.uint8).repeat_interleave(8).repeat(k // 128)  # [k]
    rows = torch.stack([q.roll(8 * r) for r in range(16)])  # each value at each slot
    packed = pack_int4(rows).to(DEVICE)
    g = torch.Generator().manual_seed(5)
    scale = (torch.rand(16, k // 32, generator=g) * 0.02 + 0.001).to(DEVICE)
    zero = (torch.randn(16, k // 32, generator=g) * 0.01).to(DEVICE)
    for magnitude in (1e-3, 1.0, 3e3):
        x = (torch.randn(2, k, generator=g) * magnitude).to(DEVICE)
        exact = x.double() @ dequantize(packed, scale, zero).double().T
        ours = launch(x, packed, scale, zero, first_of("words", 16, k), 2)
        err = ((ours.double() - exact).abs().max() / exact.abs().max()).item()
        assert err < 1e-5, (magnitude, err)


@needs_triton
def test_split_k_matches_the_reference_and_a_row_sums_alike_alone_or_with_others():
    """Configurations a GPU may choose (split K included); a row's result does not depend on
    the rows beside it (a 1-row decode step and a verification's rows agree bit for bit)."""
    n, k = 40, 512
    q, scale, zero = groups(n, k, seed=7)
    packed, scale, zero = pack_int4(q).to(DEVICE), scale.to(DEVICE), zero.to(DEVICE)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    ref = w4a16_reference(x, packed, scale, zero)
    mine = candidates(n, k, KERNELS)
    assert len({c[2] for c in mine}) > 1  # several K splits among them
    assert {c[4] for c in mine} == set(KERNELS)  # both kernels are there to time
    assert {c[4] for c in candidates(n, k)} == {"bytes"}  # the engine times the byte kernel
    firsts = [first_of(kernel, n, k) for kernel in KERNELS]
    most = [max((c for c in mine if c[4] == kernel), key=lambda c: c[2]) for kernel in KERNELS]
    for config in firsts + most:
        rows = launch(x, packed, scale, zero, config, 5)
        torch.testing.assert_close(rows, ref, atol=1e-4, rtol=1e-4)
        alone = torch.cat([launch(x[i : i + 1], packed, scale, zero, config, 1) for i in range(5)])
        assert torch.equal(rows, alone)
        # in half precision, the shares are added in fp32 and the sum rounded once: as the
        # fp32 result rounded
        h = launch(x.half(), packed, scale.half(), zero.half(), config, 5)
        assert h.dtype == torch.float16
        full = launch(
            x.half().float(), packed, scale.half().float(), zero.half().float(), config, 5
        )
        torch.testing.assert_close(h, full.half(), atol=0, rtol=0)


@needs_triton
def test_more_rows_than_one_launch_take_the_dequantized_weight():
    q, scale, zero = groups(48, 128)
    packed = pack_int4(q).to(DEVICE)
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    ours = w4a16(x, packed, scale.to(DEVICE), zero.to(DEVICE), use_triton=True)
    torch.testing.assert_close(ours, w4a16_reference(x, packed, scale.to(DEVICE), zero.to(DEVICE)),
                               atol=1e-4, rtol=1e-4)  # fmt: skip


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_the_word_kernels_lop3_is_the_mask_and_exponent_it_stands_for():
    """On a GPU the word kernel's masks are PTX lop3 with a truth table (the interpreter
    runs the Triton operations instead): the table, read bit by bit, is (w & mask) | exp."""
    from kernels import w4a16 as w

    def lop3(a: int, b: int, c: int, lut: int) -> int:
        out = 0
        for bit in range(32):
            i = ((a >> bit) & 1) << 2 | ((b >> bit) & 1) << 1 | ((c >> bit) & 1)
            out |= ((lut >> i) & 1) << bit
        return out

    g = torch.Generator().manual_seed(9)
    words = torch.randint(0, 2**32, (64,), generator=g, dtype=torch.int64).tolist()
    for mask, exp in ((w.LO_MASK, w.LO_EXP), (w.HI_MASK, w.HI_EXP)):
        for word in words:
            assert lop3(word, mask, exp, w.AND_OR_LUT) == (word & mask) | exp
    assert w.LO_ASM.value == f"lop3.b32 $0, $1, {w.LO_MASK:#x}, {w.LO_EXP:#x}, {w.AND_OR_LUT:#x};"
    assert w.HI_ASM.value == f"lop3.b32 $0, $1, {w.HI_MASK:#x}, {w.HI_EXP:#x}, {w.AND_OR_LUT:#x};"
    # the exponents: 256.0 and 16.0, and a nibble q at bits 15-18 / 19-22 adds q to each
    for q in range(16):
        lo = torch.tensor([w.LO_EXP | (q << 15)], dtype=torch.int32).view(torch.float32)
        hi = torch.tensor([w.HI_EXP | (q << 19)], dtype=torch.int32).view(torch.float32)
        assert (lo.item(), hi.item()) == (256.0 + q, 16.0 + q)


def test_bad_shapes_are_refused_by_name():
    q, scale, zero = groups(8, 64)
    with pytest.raises(ValueError, match="w4a16"):
        w4a16(torch.randn(1, 32), pack_int4(q), scale, zero)
