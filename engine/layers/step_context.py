"""Per-step metadata for the forward pass: which tokens belong to which sequence, where
their KV goes, and which pages each sequence reads. Built once per step by the runner."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class StepContext:
    page_size: int
    # per token, on the model's device
    slot_pages: torch.Tensor  # [T] page id where the token's KV is written
    slot_offsets: torch.Tensor  # [T] offset inside that page
    cos: torch.Tensor | None = None  # [T, D]
    sin: torch.Tensor | None = None
    # per sequence, host side (the reference path loops over sequences)
    query_lens: list[int] | None = None
    kv_lens: list[int] | None = None  # KV length after this step's tokens are written
    page_lists: list[torch.Tensor] | None = None  # [ceil(kv_len / page_size)] page ids each
    # per sequence, device side (decode kernel; static shapes so CUDA graphs apply)
    block_tables: torch.Tensor | None = None  # [B, max_pages] int32
    kv_lens_t: torch.Tensor | None = None  # [B] int32
    decode_only: bool = False
    # the paged decode kernel's splits per (sequence, KV head) (None: its default for the
    # rows); a verification on the GPU passes its decode step's, so that each query sums
    # as that step would
    attn_splits: int | None = None
    sliding_window: int | None = None
    prefill_attn_dtype: torch.dtype | None = None  # fast mode: prefill attention in bf16
    dense_kv: list | None = None  # per sequence: an engine.kv.dense_kv.DenseKV, or None (CPU)
    # the tiered cache (engine.kv.TieredKV) when sparse decode is on, with the step's
    # per-sequence block tables [B, max_pages] and lengths [B] (int32, device side)
    tiers: object | None = None
    tier_tables: torch.Tensor | None = None
    tier_lens: torch.Tensor | None = None
    # a verification (speculative decoding): each query token must compute exactly what a
    # single-token decode step at its position would (row_exact in engine.models.causal_lm)
    verify: bool = False
    # called with each layer's index after the layer (a verification graph's capture ends
    # one graph and begins the next there: engine.runtime.verify_graphs)
    layer_hook: object | None = None
