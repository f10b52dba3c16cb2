"""bench.w4a16_speed: what a GEMV reads, and a clear refusal without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.w4a16_speed import SHAPES, weight_bytes

ROOT = Path(__file__).resolve().parents[2]


def test_a_gemv_reads_half_a_byte_a_weight_and_two_bf16_a_group():
    # the 8B's linears: 5.41 GB a token with the bf16 embedding and head left out
    total = sum(weight_bytes(*(int(v) for v in s.split("x"))) for s in SHAPES) * 32
    assert total == 32 * sum(n * k // 2 + n * k // 8 for n, k in
                             ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)))  # fmt: skip
    assert abs(total / 1e9 - 4.36) < 0.01  # (with the head's 1.05 GB: the 5.41 above)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without one")
def test_without_a_gpu_it_says_so_in_one_line():
    run = subprocess.run([sys.executable, "-m", "bench.w4a16_speed"], cwd=ROOT, text=True,
                         capture_output=True, timeout=120)  # fmt: skip
    assert run.returncode != 0
    assert run.stderr.strip().splitlines() == [
        "bench.w4a16_speed: needs a GPU (the kernels' instructions without one: python -m "
        "bench.w4a16_sass)"
    ]
