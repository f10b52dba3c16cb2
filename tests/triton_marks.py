"""The device the kernel tests run on, and the mark for tests that need Triton (a GPU, or
the interpreter that TRITON_INTERPRET=1 turns on)."""

from __future__ import annotations

import pytest
import torch

from kernels import HAS_TRITON, INTERPRET

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not (HAS_TRITON and (INTERPRET or torch.cuda.is_available())), reason="needs triton"
)
