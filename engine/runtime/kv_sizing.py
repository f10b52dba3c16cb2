"""How many KV pages the pool gets, and the checks that refuse a pool or a request the
memory cannot hold, before anything is allocated."""

from __future__ import annotations

import torch

from engine.config import EngineConfig, ModelConfig
from engine.errors import CacheFullError


def num_pages(
    config: EngineConfig,
    model_config: ModelConfig,
    max_model_len: int,
    device: torch.device,
    dtype: torch.dtype,
) -> int:
    """The pool's size in pages: the config's, else sized from the window and the memory."""
    cfg, P = config, config.page_size
    if cfg.num_pages:
        return cfg.num_pages
    from engine.kv.pool import KVCache

    page_bytes = KVCache.bytes_per_page(model_config, P, dtype)
    if cfg.kv_cache_memory:
        return max(1, cfg.kv_cache_memory // page_bytes)
    window_pages = -(-max_model_len // P)
    if device.type == "cuda" and cfg.sparse is not None:
        # the pool is the host tier (pinned host memory): room for the windows, capped at
        # half of the host memory available
        from engine.kv.pool import host_memory_available

        avail = host_memory_available() or (8 << 30)
        want = window_pages * cfg.max_num_seqs
        return max(window_pages, min(want, (avail // 2) // page_bytes))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(free * 0.85) - (2 << 30)  # leave room for activations and graphs
        want = window_pages * cfg.max_num_seqs
        return max(window_pages, min(want, budget // page_bytes))
    # CPU: room for a few full windows, capped at 4 GiB
    return max(window_pages, min(window_pages * min(cfg.max_num_seqs, 4), (4 << 30) // page_bytes))


def check_pool_size(
    pages: int,
    config: EngineConfig,
    model_config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """CacheFullError when the KV pool cannot fit where it goes: host memory (the CPU,
    or the host tier of a sparse GPU run), else the GPU (1e14 bytes of --host-kv-budget
    once took minutes and GiBs in the block manager before the pool's own check)."""
    from engine.kv.pool import KVCache, check_host_memory

    need = pages * KVCache.bytes_per_page(model_config, config.page_size, dtype)
    if device.type == "cpu" or config.sparse is not None:
        check_host_memory(need)
        return
    total = torch.cuda.mem_get_info(device)[1]
    if need > total:
        raise CacheFullError(f"the KV pool needs {need / 2**30:.1f} GiB and the GPU has "
                             f"{total / 2**30:.1f} GiB: lower --host-kv-budget")  # fmt: skip


def check_gpu_tier(tiers, config: EngineConfig, model_config: ModelConfig, length: int) -> None:
    """CacheFullError now, not mid-answer, when the GPU tier (`tiers`, None without one)
    cannot hold one decode step's selection of a sequence of `length` tokens."""
    if tiers is None:
        return
    P = config.page_size
    need = model_config.num_kv_heads * tiers.sparse.budget_pages(-(-length // P), P)
    if need > tiers.num_slots:
        raise CacheFullError(
            f"the GPU KV budget holds {tiers.num_slots} pages per layer, fewer than the "
            f"{need} a step of this {length:,}-token sequence selects: raise "
            "--gpu-kv-budget or lower the sparse budget"
        )
