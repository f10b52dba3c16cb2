"""What the decode and verification CUDA graphs are captured over (the model, its KV and
rope, the tiered cache), the batch sizes they come in, the one rule that says whether a
step fits a graph, and the memory pool all the graphs share."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv.pool import KVCache
from engine.layers.rope import RotaryEmbedding
from engine.runtime.step_inputs import StepShape


def graph_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes graphs are captured for; a batch runs in the next size up."""
    sizes = [1, 2, 4, 8] + list(range(16, max_num_seqs + 1, 16))
    return [s for s in sizes if s <= max(1, max_num_seqs)]


@dataclass(slots=True)
class GraphSetup:
    model: torch.nn.Module
    rope: RotaryEmbedding
    kv: KVCache
    tiers: object | None  # engine.kv.TieredKV, or None
    device: torch.device
    page_size: int
    max_pages: int  # a sequence's longest block table
    scratch_page: int  # padding rows of a graph's batch write their KV there
    sizes: list[int]
    sliding_window: int | None = None
    # the memory pool of the graphs captured so far (None: none yet); the decode and the
    # verification graphs share it, so they are dropped together
    pool: object | None = None

    @property
    def max_size(self) -> int:
        return max(self.sizes)

    def size_for(self, batch_size: int) -> int | None:
        """The graph size a batch runs in (None: larger than any)."""
        return next((s for s in self.sizes if s >= batch_size), None)

    def fits(self, shape: StepShape) -> bool:
        """The eligibility rule of every graph: a batch size a graph is captured for, and
        no sequence past the sliding window (a graph reads whole tables)."""
        w = self.sliding_window
        windowed = w is not None and max(shape.kv_lens) > w
        return self.size_for(shape.batch_size) is not None and not windowed

    def tier_key(self, kv_lens: list[int]) -> tuple[int, bool]:
        """The tiered cache's part of a graph's key: the page budget at this context, and
        whether the layers prefetch (the "auto" prefetch policy switches: both kinds)."""
        t = self.tiers
        return t.budget_for(max(kv_lens), self.max_pages), t.prefetching()
