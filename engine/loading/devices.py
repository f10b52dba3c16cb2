"""Where and in what precision a model runs: the device and dtype names --device and
--dtype take, checked against this machine."""

from __future__ import annotations

import torch

from engine.errors import EngineError, ModelLoadError


def cpu_has_amx() -> bool:
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def pick_device(device: str | torch.device | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelLoadError(f"unknown device {device!r} (use cpu, cuda, cuda:N or auto)") from e
    if dev.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"device {device!r} is not supported (use cpu, cuda, cuda:N or auto)")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch has no CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise ModelLoadError(f"device {device!r}: {why}; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {device!r}: there are {torch.cuda.device_count()} GPUs")
    return dev


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}  # fmt: skip
        if dtype not in names:
            raise EngineError(f"unknown dtype {dtype!r}; use one of {', '.join(names)}")
        return names[dtype]
    return dtype
