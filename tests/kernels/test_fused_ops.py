"""RMSNorm (+residual), SiLU-mul and rope+KV append: Triton kernels against their torch
references, on small odd shapes (the interpreter on CPU, the real GPU where there is one)."""

from __future__ import annotations

import pytest
import torch

from kernels import HAS_TRITON, INTERPRET
from kernels.rmsnorm import rmsnorm, rmsnorm_reference
from kernels.rope_kv import rope_kv, rope_kv_reference
from kernels.silu_mul import silu_mul, silu_mul_reference
from kernels.views import RowPlaces
from tests.triton_marks import DEVICE

pytestmark = pytest.mark.skipif(
    not (HAS_TRITON and (INTERPRET or torch.cuda.is_available())), reason="needs triton"
)
# bf16 is checked on the GPU only: the Triton 3.9 interpreter's bf16 arithmetic is unreliable
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
# (atol, rtol): one or two units in the last place of each dtype, since a kernel and its
# reference may round a product differently at large magnitudes (bf16 ulp at 4-8 is 0.03)
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1.6e-2)}


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)


def rand(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 64), (7, 123), (3, 576)])
def test_rmsnorm(dtype, rows, cols):
    x, r, w = (
        rand(rows, cols, dtype=dtype),
        rand(rows, cols, dtype=dtype, seed=1),
        rand(cols, dtype=dtype, seed=2),
    )
    out = rmsnorm(x, w, 1e-5, use_triton=True)
    close(out, rmsnorm_reference(x, w, 1e-5), dtype)
    out, res = rmsnorm(x, w, 1e-5, r, use_triton=True)
    ref, ref_res = rmsnorm_reference(x, w, 1e-5, r)
    assert torch.equal(res, ref_res)
    close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 96), (5, 1100)])
def test_silu_mul(dtype, rows, inter):
    gu = rand(rows, 2 * inter, dtype=dtype)
    out = silu_mul(gu, use_triton=True)
    close(out, silu_mul_reference(gu), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_kv_into_an_fp8_pool(dtype):
    """An fp8 pool (EngineConfig.kv_dtype) holds the rotated k and v rounded to fp8 (k
    saturated at +-448), the returned k stays unrounded; the kernel as the reference."""
    from kernels.fp8 import FP8, to_fp8

    T, P, N, hq, hkv, d = 9, 4, 7, 4, 2, 64
    q, k, v = (rand(T, h, d, dtype=dtype, seed=s) * 150 for s, h in ((0, hq), (1, hkv), (2, hkv)))
    angles = torch.arange(T, dtype=torch.float32)[:, None] * torch.rand(d // 2)[None]
    emb = torch.cat((angles, angles), -1)
    cos, sin = emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)
    slots = torch.randperm(N * P)[:T]
    at = RowPlaces((slots // P).to(DEVICE), (slots % P).to(DEVICE))
    for use_triton in (True, False):
        kv = torch.zeros(N, hkv, 2, P, d, dtype=FP8, device=DEVICE)
        _, k_out = rope_kv(q, k, v, cos, sin, kv, at, use_triton=use_triton)
        held = kv[at.pages.long(), :, :, at.offsets.long()]  # [T, Hkv, 2, D]
        assert torch.equal(held[:, :, 0].view(torch.uint8), to_fp8(k_out).view(torch.uint8))
        assert torch.equal(held[:, :, 1].view(torch.uint8), to_fp8(v).view(torch.uint8))
        assert held.float().abs().max() == 448.0  # (some saturated)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv,d", [(6, 2, 64), (4, 4, 32), (9, 3, 128)])
def test_rope_kv(dtype, hq, hkv, d):
    T, P, N = 11, 4, 7
    qkv = rand(T, (hq + 2 * hkv) * d, dtype=dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)  # strided views, as in the model
    q, k, v = q.view(T, hq, d), k.view(T, hkv, d), v.view(T, hkv, d)
    angles = torch.arange(T, dtype=torch.float32)[:, None] * torch.rand(d // 2)[None]
    emb = torch.cat((angles, angles), -1)
    cos, sin = emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)
    slots = torch.randperm(N * P)[:T]
    pages, offs = (slots // P).to(DEVICE), (slots % P).to(DEVICE)
    kv, kv_ref = (
        torch.zeros(N, hkv, 2, P, d, dtype=dtype, device=DEVICE),
        torch.zeros(N, hkv, 2, P, d, dtype=dtype, device=DEVICE),
    )
    q_out, k_out = rope_kv(q, k, v, cos, sin, kv, RowPlaces(pages, offs), use_triton=True)
    q_ref, k_ref = rope_kv_reference(q, k, v, cos, sin, kv_ref, RowPlaces(pages, offs))
    close(q_out, q_ref, dtype)
    close(k_out, k_ref, dtype)
    close(kv, kv_ref, dtype)
    assert kv.abs().sum() > 0
