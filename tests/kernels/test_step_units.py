"""The units a sparse decode step reads (kernels.step_units): the kernel against its torch
reference, units, mask and counters, on uneven shapes."""

from __future__ import annotations

import pytest
import torch

from kernels import HAS_TRITON, INTERPRET
from kernels.step_units import SelectedCounters, step_units, step_units_reference
from tests.triton_marks import DEVICE

pytestmark = pytest.mark.skipif(
    not (HAS_TRITON and (INTERPRET or torch.cuda.is_available())), reason="needs triton"
)


@pytest.mark.parametrize(
    "B,Hkv,W,M", [(1, 2, 5, 9), (3, 8, 41, 300), (2, 4, 1, 1), (5, 1, 1100, 2048)]
)
def test_kernel_matches_the_reference(B, Hkv, W, M):
    g = torch.Generator().manual_seed(B * 100 + W)
    tables = torch.randint(0, 50_000, (B, M), generator=g, dtype=torch.int32)
    pages = torch.randint(0, M, (B, Hkv, W), generator=g, dtype=torch.int32)
    counts = torch.randint(0, W + 1, (B, Hkv), generator=g, dtype=torch.int32)
    tables, pages, counts = (t.to(DEVICE) for t in (tables, pages, counts))
    acc = [torch.tensor([0, 7, 3, 100, 9], dtype=torch.long, device=DEVICE) for _ in range(2)]
    ref = step_units_reference(tables, pages, counts, Hkv, SelectedCounters(acc[0], 1, 2, 4))
    got = step_units(tables, pages, counts, Hkv, SelectedCounters(acc[1], 1, 2, 4),
                     use_triton=True)  # fmt: skip
    assert got[0].dtype == torch.long and got[1].dtype == torch.bool
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert torch.equal(acc[1], acc[0])
    n = int(counts.sum())
    assert acc[0].tolist() == [0, 7 + n, max(3, n), 100, 10]
    # without counters: the same units, nothing counted
    again = step_units(tables, pages, counts, Hkv, None, use_triton=True)
    assert torch.equal(again[0], ref[0]) and torch.equal(again[1], ref[1])
