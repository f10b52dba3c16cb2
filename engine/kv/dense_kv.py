"""A running sequence's K and V, contiguous per layer, kept beside the paged pool on the CPU.

Attention on the CPU needs each sequence's K and V as [Hkv, L, D] rows; gathering them from
the pages every step copies the whole context per layer per token (at 7.7K tokens of SmolLM2,
~12 MB per layer, most of a decode step). This copy grows by appending the step's rows
instead. The pool stays the source of truth (prefix cache, snapshots, tiers): when the copy
does not hold exactly the rows that precede this step (a new sequence, a prefix-cache hit,
a preemption), it is rebuilt from the pages once.
"""

from __future__ import annotations

import torch

from engine.layers.attention import gather_kv


class DenseKV:
    def __init__(self, num_layers: int):
        self.k: list[torch.Tensor | None] = [None] * num_layers  # [Hkv, capacity, D]
        self.v: list[torch.Tensor | None] = [None] * num_layers
        self.length = [0] * num_layers

    def extend(
        self,
        layer: int,
        pool: torch.Tensor,
        pages: torch.Tensor,
        prior: int,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's rows (k_new, v_new: [T, Hkv, D]) after the first `prior` rows;
        returns K and V views [Hkv, prior + T, D]."""
        total = prior + k_new.shape[0]
        k, v = self.k[layer], self.v[layer]
        # rows [0, prior) of this copy are right if it ever held that many: a sequence's
        # tokens only grow, and a recompute after preemption rewrites the same values
        valid = k is not None and self.length[layer] >= prior
        if not valid or k.shape[1] < total:
            hkv, d = k_new.shape[1], k_new.shape[2]
            nk = k_new.new_empty(hkv, max(64, 2 * total), d)
            nv = v_new.new_empty(hkv, max(64, 2 * total), d)
            if prior and valid:
                nk[:, :prior], nv[:, :prior] = k[:, :prior], v[:, :prior]
            elif prior:
                nk[:, :prior], nv[:, :prior] = gather_kv(pool, pages, prior)
            self.k[layer], self.v[layer], k, v = nk, nv, nk, nv
        k[:, prior:total] = k_new.transpose(0, 1)
        v[:, prior:total] = v_new.transpose(0, 1)
        self.length[layer] = total
        return k[:, :total], v[:, :total]
