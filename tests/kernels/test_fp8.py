"""fp8 KV rows: the kernels' conversion (kernels.fp8._fp8_bits) equals torch's cast with
saturation, bit for bit, over every range e4m3 has (subnormals, ties, the largest values,
values past them, signed zeros)."""

from __future__ import annotations

import torch

from kernels.fp8 import FP8, fp8_bits_triton, to_fp8, to_kv
from tests.triton_marks import DEVICE, needs_triton


def test_to_fp8_saturates():
    x = torch.tensor([500.0, -1e6, 448.0, 1.0])
    assert to_fp8(x).float().tolist() == [448.0, -448.0, 448.0, 1.0]
    assert to_kv(x, torch.bfloat16).dtype == torch.bfloat16 and to_kv(x, FP8).dtype == FP8


@needs_triton
def test_the_kernels_conversion_equals_torchs():
    g = torch.Generator().manual_seed(0)
    every = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    every = every[~torch.isnan(every)]
    mids = (every.sort().values[1:] + every.sort().values[:-1]) / 2  # ties: to even
    x = torch.cat([
        torch.randn(20000, generator=g) * 4, torch.randn(5000, generator=g) * 0.01,
        torch.randn(2000, generator=g) * 300, every, mids, mids.nextafter(torch.tensor(1e9)),
        torch.tensor([0.0, -0.0, 449.0, -460.0, 1e30, 2.0**-10, -(2.0**-10), 2.0**-9 * 1.5]),
    ])  # fmt: skip
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        got = fp8_bits_triton(xd.to(DEVICE)).cpu().view(torch.uint8)
        want = to_fp8(xd).view(torch.uint8)
        bad = (got != want).nonzero().flatten()
        assert bad.numel() == 0, (dtype, xd[bad[:5]].tolist(), got[bad[:5]], want[bad[:5]])
