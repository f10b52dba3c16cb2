"""Triton kernels, each beside its pure-torch reference. Importable without triton."""

from __future__ import annotations

import os

# TRITON_INTERPRET=1 runs the kernels on CPU tensors (tests compare them with the references)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

try:  # triton is absent on CPU-only installs; the references serve there
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAS_TRITON = False


def host_pointer(t, what: str = "a host KV pool") -> HostPointer:
    """The argument a kernel reads or writes pinned host memory through. The pinned check is
    skipped during CUDA graph capture (it queries the driver, which capture forbids)."""
    import torch

    if not torch.cuda.is_current_stream_capturing():
        assert t.is_pinned(), f"{what} must be pinned to be used from the GPU (UVA)"
    return HostPointer(t)


class HostPointer:
    """A pinned host tensor as Triton sees a kernel argument: its address (which CUDA maps
    into the device's address space, unified virtual addressing) and its dtype. Triton
    refuses CPU tensors themselves."""

    def __init__(self, t) -> None:
        self.t, self.dtype = t, t.dtype

    def data_ptr(self) -> int:
        return self.t.data_ptr()
