"""bench.profile_decode's grouping of a step's kernels by kind."""

import re
from pathlib import Path

from pytest import approx

from bench.profile_decode import KINDS, kinds


def test_kernels_are_grouped_by_kind_per_step():
    events = [
        ("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT", 3_000_000),  # cuBLAS's GEMV
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1_000_000),
        ("_w4a16_kernel", 2_000_000),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", 100_000),
        ("_sum_splits_kernel", 100_000),  # W4A16's
        ("_paged_decode_kernel", 400_000),
        ("_combine_kernel", 200_000),
        ("_split_hist_kernel", 200_000),
        ("_resolve_kernel", 100_000),
        ("_gather_kernel", 600_000),
        ("_rmsnorm_kernel", 100_000),
        ("Memcpy DtoD (Device -> Device)", 50_000),
        ("void at::native::vectorized_elementwise_kernel<4>", 20_000),
        ("some_other_kernel", 10_000),
    ]
    got = kinds(events, steps=2)
    assert got["weights: GEMV (cuBLAS, W4A16)"] == {"ms": 3.0, "kernels": 1.5}
    assert got["weights: split-K reductions (cuBLAS, W4A16)"] == {"ms": approx(0.1), "kernels": 1}
    assert got["attention and its split combine"]["ms"] == approx(0.3)
    assert got["page scoring, selection and slot allocation"]["ms"] == approx(0.15)
    assert got["host fetch (UVA gather)"]["ms"] == approx(0.3)
    assert got["norms, rope, KV append, activation"]["ms"] == approx(0.05)
    assert got["copies and fills"]["ms"] == approx(0.025)
    assert got["torch's own kernels (index and mask glue, reductions)"]["ms"] == approx(0.01)
    assert got["other"]["ms"] == approx(0.005)
    assert kinds([], steps=1) == {}


def test_every_triton_kernel_of_ours_has_its_kind():
    """A kernel added to kernels/ without a kind would land in "other" unseen."""
    root = Path(__file__).resolve().parents[2] / "kernels"
    names = set()
    for path in root.glob("*.py"):
        names |= set(re.findall(r"@triton\.jit[^\n]*\n\s*def (_\w+_kernel)\(", path.read_text()))
    assert names, "no kernels found"
    for name in sorted(names):
        kind = next(k for k, pattern in KINDS if re.search(pattern, name, re.IGNORECASE))
        assert kind != "other", name
