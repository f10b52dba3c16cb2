"""Triton kernels, each beside its pure-torch reference. Importable without triton."""

from __future__ import annotations

try:  # triton is absent on CPU-only installs; the references serve there
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAS_TRITON = False
