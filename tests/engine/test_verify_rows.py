"""A verification on the GPU without the tiered cache runs each of its queries as one row of
the paged decode kernel (engine.layers.attention.per_query_tables): checked here in the
Triton interpreter against causal attention over each sequence's keys, and row by row
against the decode step the query stands for (bit for bit, at the same split count)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers.attention import per_query_tables
from kernels import HAS_TRITON, INTERPRET
from kernels.paged_decode import paged_decode_attention
from kernels.views import PagedKV
from tests.triton_marks import DEVICE

pytestmark = pytest.mark.skipif(
    not (HAS_TRITON and (INTERPRET or torch.cuda.is_available())), reason="needs triton"
)


def test_layout_of_queries():
    rows, lens = per_query_tables([torch.tensor([4, 1]), [7, 2, 9]], [20, 37], 3)
    assert rows == [[4, 1, 0]] * 3 + [[7, 2, 9]] * 3
    assert lens == [18, 19, 20, 35, 36, 37]


def test_graph_rows_of_a_verification():
    """The inputs a verification's decode-graph replay gets (engine.runtime.verify_rows):
    tokens, positions and slots as they are, per row its sequence's pages and its length."""
    from engine.runtime.step_inputs import StepInputs
    from engine.runtime.verify_rows import per_query_inputs

    b = StepInputs(query_lens=[2, 2], kv_lens=[20, 37], ids=[5, 6, 7, 8],
                   positions=[18, 19, 35, 36], pages=[1, 1, 9, 9], offsets=[2, 3, 3, 4],
                   page_lists=[[4, 1], [7, 2, 9]])  # fmt: skip
    r = per_query_inputs(b, 2)
    assert r.query_lens == [1, 1, 1, 1] and r.kv_lens == [19, 20, 36, 37]
    assert r.page_lists == [[4, 1], [4, 1], [7, 2, 9], [7, 2, 9]]
    assert (r.ids, r.positions, r.pages, r.offsets) == (b.ids, b.positions, b.pages, b.offsets)


@pytest.mark.parametrize("T", [1, 2, 5])
def test_rows_equal_causal_attention_and_their_decode_steps(T):
    g = torch.Generator().manual_seed(T)
    P, Hkv, G, D = 16, 2, 3, 64
    kv_lens = [23, 50]
    page_lists = [[5, 0], [1, 6, 3, 2]]
    kv = torch.randn(8, Hkv, 2, P, D, generator=g)
    q = torch.randn(len(kv_lens) * T, Hkv * G, D, generator=g)
    rows, lens = per_query_tables(page_lists, kv_lens, T)
    tables = torch.tensor(rows, dtype=torch.int32)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    args = [t.to(DEVICE) for t in (q, kv, tables, lens_t)]
    out = paged_decode_attention(args[0], PagedKV(*args[1:]), D**-0.5, num_splits=4,
                                 use_triton=True).cpu()  # fmt: skip
    for b, (pages, n) in enumerate(zip(page_lists, kv_lens, strict=True)):
        k = kv[pages][:, :, 0].transpose(0, 1).reshape(Hkv, -1, D)[:, :n]
        v = kv[pages][:, :, 1].transpose(0, 1).reshape(Hkv, -1, D)[:, :n]
        qs = q[b * T : (b + 1) * T].transpose(0, 1)[None]  # [1, Hq, T, D]
        mask = torch.arange(n)[None, :] <= torch.arange(n - T, n)[:, None]
        ref = F.scaled_dot_product_attention(qs, k[None], v[None], attn_mask=mask,
                                             enable_gqa=True)[0].transpose(0, 1)  # fmt: skip
        assert (out[b * T : (b + 1) * T] - ref).abs().max() < 1e-4
        for t in range(T):  # the decode step at that position: one row, the same splits
            i = b * T + t
            one = paged_decode_attention(
                args[0][i : i + 1], PagedKV(args[1], args[2][i : i + 1], args[3][i : i + 1]),
                D**-0.5, num_splits=4, use_triton=True,
            ).cpu()  # fmt: skip
            assert torch.equal(one[0], out[i])
