"""The benchmarks' synthetic decode scores (bench.synthetic_draw): the Triton kernels and the
torch reference follow the same rules (a page read at the step before wins again with
probability `keep`, every other page scores in [0, 1)), the stamps record exactly the valid
pages, and the kernel draws afresh as the engine's step clock moves."""

from __future__ import annotations

import pytest
import torch

from bench.synthetic_draw import NEVER, synthetic_draw, synthetic_stamp
from tests.bench.test_synthetic_select import IMPLS
from tests.triton_marks import DEVICE, needs_triton


@pytest.mark.parametrize("impl", IMPLS)
def test_draw_rules(impl):
    g = torch.Generator().manual_seed(0)
    rows, Hkv, M = 2, 3, 4000
    stamp = torch.full((rows, Hkv, M + 9), NEVER, dtype=torch.int32)
    roll = torch.rand(rows, Hkv, M, generator=g)
    stamp[..., :M][roll < 0.3] = 6  # read at the step before (the clock is 7)
    stamp[..., :M][(roll >= 0.3) & (roll < 0.5)] = 4  # read earlier
    clock = torch.tensor(7, device=DEVICE)
    scores = synthetic_draw(stamp.to(DEVICE), clock, 0.77, M, salt=5,
                            use_triton=impl == "triton").cpu()  # fmt: skip
    assert scores.shape == (rows, Hkv, M) and scores.dtype == torch.float32
    last = stamp[..., :M] == 6
    kept = scores >= 2.0
    assert not (kept & ~last).any()  # only pages read at the step before win again
    rate = kept[last].float().mean().item()
    assert abs(rate - 0.77) < 0.03, rate
    assert (scores[~kept] >= 0).all() and (scores[~kept] < 1).all() and (scores[kept] < 3).all()
    assert scores[~kept].std() > 0.25  # (uniform: std 0.289)


@pytest.mark.parametrize("impl", IMPLS)
def test_stamps_record_exactly_the_valid_pages(impl):
    rows, Hkv, W, pages_total = 2, 3, 40, 300
    g = torch.Generator().manual_seed(1)
    pages = torch.stack([torch.randperm(pages_total, generator=g)[:W] for _ in range(rows * Hkv)])
    pages = pages.view(rows, Hkv, W).to(torch.int32)
    valid = torch.rand(rows, Hkv, W, generator=g) < 0.7
    stamp = torch.full((rows, Hkv, pages_total + 1), NEVER, dtype=torch.int32)
    stamp[0, 0, 5] = 3  # an earlier step's
    got = stamp.to(DEVICE)
    synthetic_stamp(got, pages.to(DEVICE), valid.to(DEVICE), torch.tensor(9, device=DEVICE),
                    use_triton=impl == "triton")  # fmt: skip
    want = stamp.clone()
    for r in range(rows):
        for h in range(Hkv):
            want[r, h, pages[r, h][valid[r, h]].long()] = 9
    assert torch.equal(got.cpu(), want)


@needs_triton
def test_the_kernel_draws_afresh_as_the_clock_moves():
    stamp = torch.full((1, 2, 600), NEVER, dtype=torch.int32, device=DEVICE)
    clock = torch.tensor(1, device=DEVICE)
    a = synthetic_draw(stamp, clock, 0.5, 500, use_triton=True)
    assert torch.equal(a, synthetic_draw(stamp, clock, 0.5, 500, use_triton=True))
    assert not torch.equal(a, synthetic_draw(stamp, clock, 0.5, 500, salt=1, use_triton=True))
    clock += 1
    assert not torch.equal(a, synthetic_draw(stamp, clock, 0.5, 500, use_triton=True))
