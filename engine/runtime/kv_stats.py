"""Where the context's KV lives now, and what sparse decode fetched so far."""

from __future__ import annotations

import torch

from engine.runtime.block_manager import BlockManager


def kv_stats(block_manager: BlockManager, tiers, page_size: int, device: torch.device) -> dict:
    """host_tokens (pages in use x page size), gpu_tokens (for the tiered cache `tiers`: the
    pages resident on the GPU per layer and head x page size; dense on a GPU: all of them),
    and for sparse decode: selected pages per layer-step, host fetch fraction, bytes
    fetched per layer-step."""
    P = page_size
    in_use = (block_manager.num_blocks - block_manager.num_free_blocks) * P
    if tiers is None:
        on_gpu = device.type == "cuda"
        return {"host_tokens": 0 if on_gpu else in_use, "gpu_tokens": in_use if on_gpu else 0}
    st = tiers.stats
    per_unit = tiers.L * tiers.Hkv
    return {
        "host_tokens": in_use,
        "gpu_tokens": tiers.resident_units() * P // per_unit,
        "selected_pages_per_step": st.selected / st.steps if st.steps else 0.0,
        "fetch_fraction": st.fetch_fraction,
        "fetched_bytes_per_step": st.fetched_bytes / st.steps if st.steps else 0.0,
        # Forecast prefetch: recall of the predicted pages, and the share of the fetched
        # pages that were fetched ahead of the attention that read them
        "forecast_recall": st.recall if st.recall_total else None,
        "prefetch_fraction": (
            st.prefetch_hits / (st.prefetch_hits + st.demand_fetched)
            if st.prefetch_hits + st.demand_fetched
            else None
        ),  # fmt: skip
        "prefetch": _prefetch_state(tiers),
    }


def _prefetch_state(tiers) -> dict | None:
    """The Forecast prefetch policy's state (engine.kv.prefetch_policy): on or off now,
    the MiB per layer-step the steps needed from the host, the last trial's medians
    (ms per step without, with); None without a forecast."""
    if tiers.sparse.forecast == "off":
        return None
    last = tiers.trials.decisions[-1] if tiers.trials.decisions else None
    return {"policy": tiers.sparse.prefetch_policy, "on": tiers.prefetching(),
            "need_mib": tiers.need_mib, "trial_ms": list(last) if last else None}  # fmt: skip
