"""bench.profile_decode's grouping of a step's kernels by kind."""

from bench.profile_decode import kinds


def test_kernels_are_grouped_by_kind_per_step():
    events = [
        ("nvjet_tst_64x8_64x16_2x1_v_bz_TNT", 3_000_000),  # cuBLAS's GEMV
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1_000_000),
        ("_w4a16_gemv_kernel", 2_000_000),
        ("_paged_decode_kernel", 400_000),
        ("_page_topk_hist_kernel", 200_000),
        ("_uva_gather_kernel", 600_000),
        ("_rmsnorm_kernel", 100_000),
        ("Memcpy DtoD (Device -> Device)", 50_000),
        ("void at::native::vectorized_elementwise_kernel<4>", 20_000),
    ]
    got = kinds(events, steps=2)
    assert got["weights: GEMM/GEMV"] == {"ms": 3.0, "kernels": 1.5}
    assert got["attention"]["ms"] == 0.2 and got["page selection and allocation"]["ms"] == 0.1
    assert (
        got["host fetch"]["ms"] == 0.3 and got["norms, rope, KV append, activation"]["ms"] == 0.05
    )
    assert got["copies and fills"]["ms"] == 0.025 and got["other"]["ms"] == 0.01
    assert kinds([], steps=1) == {}
