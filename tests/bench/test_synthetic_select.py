"""The benchmarks' synthetic verification scores: the Triton kernel and the torch reference
draw with the same rules (query 0 untouched, 15% of a later query's pages dropped, pages
read before lifted so that about `recurring` of the replacements recur)."""

from __future__ import annotations

import pytest
import torch

from bench.synthetic_select import synthetic_query_scores
from tests.triton_marks import DEVICE, needs_triton

IMPLS = ["torch", pytest.param("triton", marks=needs_triton)]


@pytest.mark.parametrize("impl", IMPLS)
def test_draw_rules(impl):
    torch.manual_seed(0)
    B, T, Hkv, M = 2, 5, 2, 3000
    first = (torch.rand(B, Hkv, M) + 2.0 * (torch.rand(B, Hkv, M) < 0.05).float()).to(DEVICE)
    seen = torch.zeros(B, Hkv, M + 40, dtype=torch.bool)  # (wider: the pool's)
    seen[..., :M] = torch.rand(B, Hkv, M) < 0.3
    seen = seen.to(DEVICE)
    budgets = torch.full((B * T,), 150, dtype=torch.int32, device=DEVICE)
    clock = torch.tensor(7, device=DEVICE)
    out = synthetic_query_scores(first, T, budgets, seen, 0.86, clock, salt=3,
                                 use_triton=impl == "triton")  # fmt: skip
    assert out.shape == (B * T, Hkv, M)
    out = out.view(B, T, Hkv, M).cpu()
    first, seen = first.cpu(), seen[..., :M].cpu()
    assert torch.equal(out[:, 0], first)  # query 0 keeps the step's draw
    diff = out[:, 1:] - first[:, None]
    dropped = (diff < -2).float().mean().item()
    assert abs(dropped - 0.15) < 0.01, dropped
    lifted = (diff > 0.5) | ((diff < -2) & (diff > -3.5))
    assert not (lifted & ~seen[:, None]).any()  # only pages read before are lifted
    # ~ 0.86 x 0.15 x budget lifted outside query 0's selection, of the seen pages
    want = 0.86 * 0.15 * 150 / (seen.sum(-1).float() - 150)
    rate = lifted.float().sum(-1) / seen.sum(-1)[:, None]
    assert torch.allclose(rate.mean(1), want, rtol=0.25), (rate.mean(1), want)
    assert set(diff.unique().round(decimals=4).tolist()) <= {0.0, -4.0, 1.0, -3.0}


@needs_triton
def test_triton_draws_afresh_as_the_clock_moves():
    first = torch.rand(1, 2, 500, device=DEVICE)
    budgets = torch.full((3,), 40, dtype=torch.int32, device=DEVICE)
    clock = torch.tensor(1, device=DEVICE)
    a = synthetic_query_scores(first, 3, budgets, None, 0.0, clock, use_triton=True)
    b = synthetic_query_scores(first, 3, budgets, None, 0.0, clock, use_triton=True)
    assert torch.equal(a, b)  # same clock and salt: the same draw
    clock += 1
    c = synthetic_query_scores(first, 3, budgets, None, 0.0, clock, use_triton=True)
    assert not torch.equal(a, c)
