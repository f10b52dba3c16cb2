"""The sparse paged decode kernel against its torch reference (small odd shapes, several
query tokens, per-head page lists of different lengths), and the reference against dense
attention when every page is listed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import HAS_TRITON, INTERPRET
from kernels.sparse_decode import sparse_decode_attention, sparse_decode_reference
from kernels.views import PageList
from tests.triton_marks import DEVICE, needs_triton

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def sparse(q, kv, units, pages, counts, lens, scale, qmask=None, **kw):
    """sparse_decode_attention of the raw tensors."""
    return sparse_decode_attention(q, kv, PageList(units, pages, counts, qmask), lens, scale, **kw)


def sparse_ref(q, kv, units, pages, counts, lens, scale, qmask=None):
    """sparse_decode_reference of the raw tensors."""
    return sparse_decode_reference(q, kv, PageList(units, pages, counts, qmask), lens, scale)


def make_case(group, head_dim, T, dtype, seed, full=False, P=16, Hkv=2, lens=(5, 37, 100)):
    """Sequences of `lens` tokens in a shuffled pool of page units, and for each (sequence,
    head) a random subset of its pages that always holds the last one (the queries' own)."""
    g = torch.Generator().manual_seed(seed)
    n_pages = [-(-n // P) for n in lens]
    total = sum(n_pages) * Hkv
    kv = torch.randn(total + 3, 2, P, head_dim, generator=g).to(dtype)
    order = torch.randperm(total + 3, generator=g)
    B, M = len(lens), max(n_pages)
    units = torch.zeros(B, Hkv, M, dtype=torch.int32)
    pages = torch.zeros(B, Hkv, M, dtype=torch.int32)
    counts = torch.zeros(B, Hkv, dtype=torch.int32)
    unit_of = {}
    used = 0
    for b, n in enumerate(n_pages):
        for h in range(Hkv):
            for p in range(n):
                unit_of[b, h, p] = int(order[used])
                used += 1
            keep = [p for p in range(n) if full or p == n - 1 or torch.rand(1, generator=g) < 0.5]
            counts[b, h] = len(keep)
            pages[b, h, : len(keep)] = torch.tensor(keep, dtype=torch.int32)
            units[b, h, : len(keep)] = torch.tensor([unit_of[b, h, p] for p in keep])
    q = torch.randn(B, T, Hkv * group, head_dim, generator=g).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    return q, kv, units, pages, counts, lens_t, unit_of


@needs_triton
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernel_matches_reference(group, head_dim, T, dtype):
    if dtype is torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("bf16 tl.dot is broken in the Triton interpreter")
    case = make_case(group, head_dim, T, dtype, seed=group * 10 + head_dim + T)
    args = [t.to(DEVICE) for t in case[:6]]
    scale = head_dim**-0.5
    out = sparse(*args, scale, num_splits=3, block_pages=2, use_triton=True)
    ref = sparse_ref(*args, scale)
    assert out.shape == ref.shape
    assert (out.float() - ref.float()).abs().max().item() < TOL[dtype]


@needs_triton
@pytest.mark.parametrize("T", [1, 3])
def test_fp8_rows_are_attended_as_their_values(T):
    """An fp8 pool (EngineConfig.kv_dtype): the kernel converts each row to the query's
    dtype, so it attends exactly as over the same values in fp32."""
    from kernels.fp8 import to_fp8

    case = make_case(4, 64, T, torch.float32, seed=5)
    q, kv, rest = case[0], case[1], case[2:6]
    kv8 = to_fp8(kv * 3)
    args = [t.to(DEVICE) for t in rest]
    out = sparse(q.to(DEVICE), kv8.to(DEVICE), *args, 0.125, num_splits=3, use_triton=True)
    want = sparse_ref(q.to(DEVICE), kv8.float().to(DEVICE), *args, 0.125)
    assert (out.float() - want.float()).abs().max().item() < 1e-4
    assert (sparse_ref(q.to(DEVICE), kv8.to(DEVICE), *args, 0.125) == want).all()


@pytest.mark.parametrize("T", [1, 4])
def test_reference_with_every_page_is_dense_causal_attention(T):
    group, D, P, Hkv = 3, 64, 16, 2
    q, kv, units, pages, counts, lens, unit_of = make_case(group, D, T, torch.float32, 7, full=True)
    out = sparse_ref(q, kv, units, pages, counts, lens, D**-0.5)
    for b, n in enumerate(lens.tolist()):
        n_pages = -(-n // P)
        k = torch.stack(
            [torch.cat([kv[unit_of[b, h, p], 0] for p in range(n_pages)])[:n] for h in range(Hkv)]
        )
        v = torch.stack(
            [torch.cat([kv[unit_of[b, h, p], 1] for p in range(n_pages)])[:n] for h in range(Hkv)]
        )
        qs = q[b].transpose(0, 1)[None]  # [1, Hq, T, D]
        mask = torch.arange(n)[None, :] <= torch.arange(n - T, n)[:, None]
        dense = F.scaled_dot_product_attention(
            qs, k[None], v[None], attn_mask=mask, enable_gqa=True
        )
        assert torch.allclose(out[b], dense[0].transpose(0, 1), atol=1e-5)


@needs_triton
def test_empty_splits_and_one_page_lists():
    # many splits for few pages: most splits see nothing and must weigh zero
    q, kv, units, pages, counts, lens, _ = make_case(4, 64, 1, torch.float32, 3, lens=(3, 16, 17))
    args = [t.to(DEVICE) for t in (q, kv, units, pages, counts, lens)]
    out = sparse(*args, 0.125, num_splits=8, block_pages=1, use_triton=True)
    assert torch.isfinite(out).all()
    assert (out - sparse_ref(*args, 0.125)).abs().max().item() < 1e-4


def random_qmask(counts: torch.Tensor, M: int, T: int, seed: int) -> torch.Tensor:
    """Bits per listed entry: each query reads a random subset, always its last entry."""
    g = torch.Generator().manual_seed(seed)
    B, Hkv = counts.shape
    bits = torch.randint(0, 1 << T, (B, Hkv, M), generator=g, dtype=torch.int32)
    last = (counts.long() - 1).clamp(min=0)[..., None]
    bits.scatter_(-1, last, torch.full_like(last, (1 << T) - 1, dtype=torch.int32))
    return bits


@needs_triton
@pytest.mark.parametrize("group", [1, 4])
def test_kernel_with_per_query_masks_matches_reference(group):
    T = 3
    case = make_case(group, 64, T, torch.float32, seed=50 + group)
    q, kv, units, pages, counts, lens, _ = case
    qmask = random_qmask(counts, units.shape[-1], T, seed=group)
    args = [t.to(DEVICE) for t in (q, kv, units, pages, counts, lens)]
    out = sparse(*args, 0.125, num_splits=2, block_pages=2, use_triton=True,
                                  qmask=qmask.to(DEVICE))  # fmt: skip
    ref = sparse_ref(*args, 0.125, qmask=qmask.to(DEVICE))
    assert (out.float() - ref.float()).abs().max().item() < TOL[torch.float32]
    assert (ref - sparse_ref(*args, 0.125)).abs().max() > 1e-3  # the mask matters


def test_a_masked_union_gives_each_query_its_own_pages():
    """Query t over the union list with its bits is query t alone over its own list."""
    T, group, D = 3, 2, 64
    q, kv, units, pages, counts, lens, _ = make_case(group, D, T, torch.float32, seed=61)
    qmask = random_qmask(counts, units.shape[-1], T, seed=5)
    out = sparse_ref(q, kv, units, pages, counts, lens, D**-0.5, qmask=qmask)
    B, Hkv, _ = units.shape
    for t in range(T):
        own_units, own_pages = torch.zeros_like(units), torch.zeros_like(pages)
        own_counts = torch.zeros_like(counts)
        for b in range(B):
            for h in range(Hkv):
                c = int(counts[b, h])
                keep = ((qmask[b, h, :c] >> t) & 1).bool()
                n = int(keep.sum())
                own_units[b, h, :n], own_pages[b, h, :n] = (
                    units[b, h, :c][keep],
                    pages[b, h, :c][keep],
                )
                own_counts[b, h] = n
        # query t alone: the sequence ends at its own position
        lens_t = lens - (T - 1 - t)
        alone = sparse_ref(q[:, t : t + 1], kv, own_units, own_pages, own_counts,
                                        lens_t, D**-0.5)  # fmt: skip
        torch.testing.assert_close(out[:, t : t + 1], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_triton", [False, True])
def test_rows_past_the_context_never_leak_in(use_triton):
    """Rows after a sequence's last token (a rejected draft, pool memory never written) may
    hold NaN: the output must not see them."""
    if use_triton and not (HAS_TRITON and (INTERPRET or torch.cuda.is_available())):
        pytest.skip("needs triton")
    q, kv, units, pages, counts, lens, _ = make_case(2, 64, 2, torch.float32, seed=71)
    clean = sparse_ref(q, kv, units, pages, counts, lens, 0.125)
    P = kv.shape[2]
    for b, n in enumerate(lens.tolist()):
        last = (n - 1) // P
        for h in range(units.shape[1]):
            c = int(counts[b, h])
            for e in range(c):
                if int(pages[b, h, e]) == last:
                    kv[int(units[b, h, e]), :, n % P or P :] = float("nan")
    args = [t.to(DEVICE) for t in (q, kv, units, pages, counts, lens)]
    out = sparse(*args, 0.125, num_splits=2, block_pages=2, use_triton=use_triton)
    assert not out.isnan().any()
    torch.testing.assert_close(out.cpu().float(), clean, rtol=1e-4, atol=1e-4)
