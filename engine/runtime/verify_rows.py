"""Verifications without the tiered cache, in CUDA graphs: a verification of B sequences
and T positions each is a decode step of B * T rows. Each row is one query: its token, its
position, its KV slot, its sequence's pages and its own length (query t of a sequence of
n tokens sees n - T + 1 + t keys; the rows before it in this step wrote their KV first, as
every layer appends before it attends). So the decode graphs serve it as they are, over a
batch of rows (engine.runtime.decode_graphs), with the attention split as the plain decode
step of B sequences splits it (a query sums in that step's order).

Eagerly, such a verification of Qwen2.5-Coder-0.5B cost ~10 ms on an H200 against a
1.6-1.9 ms graph step (launches from Python): too dear for drafts to pay.
"""

from __future__ import annotations

import dataclasses

from engine.layers.attention import query_lengths
from engine.runtime.decode_graphs import DecodeGraphs
from engine.runtime.graph_setup import GraphSetup
from engine.runtime.step_inputs import StepInputs

ROW_SIZES = [2, 4, 8, 16, 32, 64]  # rows a graph is captured for (B * T, padded up)


def per_query_inputs(batch: StepInputs, T: int) -> StepInputs:
    """A verification's inputs as B * T decode rows (tokens, positions and slots as they
    are; per row its sequence's pages and its own length)."""
    lens = query_lengths(batch.kv_lens, T)
    pages = [p for p in batch.page_lists for _ in range(T)]
    return dataclasses.replace(batch, query_lens=[1] * len(lens), kv_lens=lens,
                               page_lists=pages)  # fmt: skip


class VerifyRowGraphs:
    """Decode graphs over rows, one set per attention split count (each captured when
    first needed)."""

    def __init__(self, setup: GraphSetup, kv_heads: int) -> None:
        self.setup, self.kv_heads = setup, kv_heads
        self.by_splits: dict[int, DecodeGraphs] = {}
        self.replays = 0

    def eligible(self, batch: StepInputs, T: int) -> bool:
        rows = len(batch.kv_lens) * T
        w = self.setup.sliding_window
        return (
            rows <= ROW_SIZES[-1]
            and self.setup.size_for(len(batch.kv_lens)) is not None
            and not (w is not None and max(batch.kv_lens) > w)
        )

    def replay(self, batch: StepInputs, T: int):
        """The verification's logits [B * T, V]: a view of a graph's output, rewritten by
        its next replay."""
        from kernels.paged_decode import default_num_splits

        s = self.setup
        splits = default_num_splits(s.size_for(len(batch.kv_lens)), self.kv_heads, s.device)
        graphs = self.by_splits.get(splits)
        if graphs is None:
            rows_setup = dataclasses.replace(s, sizes=list(ROW_SIZES), pool=None)
            graphs = DecodeGraphs(rows_setup, attn_splits=splits, capture_now=False)
            self.by_splits[splits] = graphs
        self.replays += 1
        return graphs.replay(per_query_inputs(batch, T))

    def reset(self) -> None:
        self.by_splits.clear()
