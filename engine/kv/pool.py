"""The paged KV pool: allocated once, one view per layer.

Layout [layers, pages, kv_heads, 2, page_size, head_dim]: for every (layer, page, KV head)
the K rows and then the V rows form one contiguous block (4 KB for SmolLM2 in bf16 and
8 KB for a Llama-3-8B head), the unit the tiered cache will move as one transfer.
"""

from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.errors import CacheFullError


def host_memory_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_host_memory(nbytes: int) -> None:
    """CacheFullError when a KV pool of `nbytes` cannot fit in the host memory available."""
    available = host_memory_available()
    if available is not None and nbytes > available:
        raise CacheFullError(
            f"the KV pool needs {nbytes / 2**30:.1f} GiB of host memory and "
            f"{available / 2**30:.1f} GiB is available: lower --host-kv-budget"
        )


class KVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
        pinned: bool = False,
    ):
        """pinned: allocate in pinned host memory (the host tier of a GPU run)."""
        self.num_pages, self.page_size = num_pages, page_size
        shape = (cfg.num_layers, num_pages, cfg.num_kv_heads, 2, page_size, cfg.head_dim)
        nbytes = self.bytes_per_page(cfg, page_size, dtype) * num_pages
        if pinned:
            device = torch.device("cpu")
        if torch.device(device).type == "cpu":
            check_host_memory(nbytes)
        try:
            self.pool = torch.empty(shape, dtype=dtype, device=device, pin_memory=pinned)
        except (RuntimeError, torch.OutOfMemoryError) as e:
            raise CacheFullError(
                f"cannot allocate the KV pool ({nbytes / 2**30:.1f} GiB on {device}): "
                f"{str(e).splitlines()[0]}"
            ) from None
        self.layers = list(self.pool.unbind(0))  # per-layer views [pages, Hkv, 2, P, D]

    @staticmethod
    def bytes_per_page(cfg: ModelConfig, page_size: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return cfg.num_layers * cfg.num_kv_heads * 2 * page_size * cfg.head_dim * elem

    @property
    def nbytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()
