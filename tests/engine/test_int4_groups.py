"""engine.loading.int4_groups: a float weight as 4-bit groups of 32 (the int4-all mode)."""

from __future__ import annotations

import pytest
import torch

from engine.loading.int4_groups import int4_groups


def _rebuilt(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    g = q.float().reshape(n, k // 32, 32)
    return (g * scale[..., None] + zero[..., None]).reshape(n, k)


def test_a_weight_already_on_16_levels_is_found_exactly() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (8, 128), generator=gen)
    q[:, ::32], q[:, 1::32] = 0, 15  # every group spans the whole grid
    scale = torch.rand(8, 4, generator=gen) * 0.1 + 0.01
    zero = torch.randn(8, 4, generator=gen) * 0.1
    w = _rebuilt(q, scale, zero)
    gq, gs, gz = int4_groups(w)
    assert torch.equal(gq.long(), q)
    torch.testing.assert_close(_rebuilt(gq, gs, gz), w, rtol=0, atol=1e-6)


def test_error_is_no_worse_than_the_plain_min_max_grid() -> None:
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(300, 256, generator=gen) * 0.05  # more rows than one chunk
    gq, gs, gz = int4_groups(w)
    assert gq.dtype == torch.uint8 and int(gq.max()) <= 15
    err = (_rebuilt(gq, gs, gz) - w).square().reshape(300, 8, 32).sum(-1)
    g = w.reshape(300, 8, 32)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    step = (hi - lo) / 15
    plain = ((torch.round((g - lo) / step) * step + lo) - g).square().sum(-1)
    assert (err <= plain * (1 + 1e-5) + 1e-12).all()
    assert err.sum() < 0.95 * plain.sum()  # the fitted grids do better on the whole
    # a least-squares grid may clip an outlier, but not by much more than a (plain) step
    assert ((_rebuilt(gq, gs, gz) - w).abs().reshape(300, 8, 32) <= step * 1.25).all()


def test_a_constant_group_and_a_zero_group() -> None:
    w = torch.zeros(2, 64)
    w[0, 32:] = 0.25
    gq, gs, gz = int4_groups(w)
    assert torch.equal(_rebuilt(gq, gs, gz), w)


def test_a_shape_the_kernel_cannot_take_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        int4_groups(torch.zeros(4, 40))
