"""A window-bounded KV cache for draft forwards, and the forward pass that uses it.

A drafter (the target model itself, or a smaller model of the same tokenizer) attends only
to the attention sinks (the first S positions) and the last W positions of the context, held
in a ring: position p < S sits at index p, a later one at S + (p - S) mod W, so a new
position overwrites the one W places before it. A few tail entries past the ring hold the
tokens being drafted, which are not part of the context until the target accepts them.
The memory is L x (S + W + tail) x KV heads x head_dim x 2, whatever the context length.

Entries are kept in no particular order: keys carry their rotary position already (RoPE is
applied before they are stored) and a query's mask is built from the stored positions, so
attention over the ring is the same as over the sinks and window laid out in order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class RingKV:
    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        sinks: int,
        window: int,
        tail: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        assert sinks >= 0 and window >= 1 and tail >= 1
        self.S, self.W, self.tail_cap = sinks, window, tail
        cap = sinks + window + tail
        self.k = torch.zeros(num_layers, kv_heads, cap, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.pos = torch.full((cap,), -1, dtype=torch.long, device=device)  # -1: empty
        self.tail_len = 0
        self.next_pos = 0  # context positions before this one are in the ring (or aged out)

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size() + self.pos.numel() * 8

    def ring_index(self, positions: list[int]) -> list[int]:
        S, W = self.S, self.W
        return [p if p < S else S + (p - S) % W for p in positions]

    def tail_index(self, n: int) -> list[int]:
        start = self.S + self.W + self.tail_len
        assert self.tail_len + n <= self.tail_cap, "draft longer than the ring's tail"
        return list(range(start, start + n))

    def clear_tail(self) -> None:
        self.pos[self.S + self.W :] = -1
        self.tail_len = 0

    def keep_positions(self, positions: list[int]) -> list[int]:
        """Of `positions` (ascending), those the ring keeps: the sinks and the last W."""
        if not positions:
            return []
        last = positions[-1]
        return [p for p in positions if p < self.S or p > last - self.W]

    def store(self, k: torch.Tensor, v: torch.Tensor, positions: list[int]) -> None:
        """Put context KV computed elsewhere (k, v [L, T, Hkv, D]: the target's own, read from
        its pool) into the ring at `positions`."""
        kept = set(self.keep_positions(positions))
        keep = [i for i, p in enumerate(positions) if p in kept]
        if not keep:
            return
        idx = torch.tensor(self.ring_index([positions[i] for i in keep]), device=self.k.device)
        rows = torch.tensor(keep, device=k.device)
        self.k[:, :, idx] = k[:, rows].to(self.k).transpose(1, 2)
        self.v[:, :, idx] = v[:, rows].to(self.v).transpose(1, 2)
        self.pos[idx] = torch.tensor([positions[i] for i in keep], device=self.k.device)

    def commit_tail(self, n: int) -> None:
        """The first n tail entries (drafted tokens the target accepted) join the context."""
        if n <= 0:
            return
        start = self.S + self.W
        src = torch.arange(start, start + n, device=self.k.device)
        positions = self.pos[src].tolist()
        dst = torch.tensor(self.ring_index(positions), device=self.k.device)
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]
        self.pos[dst] = self.pos[src]


@torch.inference_mode()
def ring_forward(model, rope, ring: RingKV, ids: list[int], positions: list[int],
                 to_tail: bool) -> torch.Tensor:  # fmt: skip
    """Run `model` over tokens `ids` at `positions` (ascending), attending to the ring's
    entries and to each other (causally), and store their KV: in the ring (context tokens) or
    in the tail (drafted tokens). Returns the last position's logits [V] (fp32)."""
    dev = ring.k.device
    T = len(ids)
    if to_tail:
        dest = ring.tail_index(T)
        keep = list(range(T))
    else:  # of a long stretch, only the sinks and the last W positions are stored
        kept = set(ring.keep_positions(positions))
        keep = [i for i, p in enumerate(positions) if p in kept]
        dest = ring.ring_index([positions[i] for i in keep])
    logits = ring_layers(
        model, rope, ring, torch.tensor(ids, device=dev), torch.tensor(positions, device=dev),
        torch.tensor(dest, device=dev, dtype=torch.long),
        None if len(keep) == T else torch.tensor(keep, device=dev, dtype=torch.long),
    )  # fmt: skip
    if to_tail:
        ring.tail_len += T
    return logits


def ring_layers(model, rope, ring: RingKV, ids: torch.Tensor, pos: torch.Tensor,
                dest: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """ring_forward's pass on device tensors (ids, pos [T]; the KV of rows `keep`, all when
    None, goes to ring entries `dest`): no host reads, so a CUDA graph can hold it
    (engine.spec.ring_graph). Returns the last position's logits [V] (fp32)."""
    T = ids.shape[0]
    cos, sin = rope(pos)
    key_pos = torch.cat([ring.pos, pos])
    mask = (key_pos[None, :] >= 0) & (key_pos[None, :] <= pos[:, None])  # [T, C + T]
    x, residual = model.embed_tokens(ids), None
    for layer_idx, layer in enumerate(model.layers):
        if residual is None:
            h, residual = layer.input_layernorm.forward(x), x
        else:
            h, residual = layer.input_layernorm.forward(x, residual)
        a = layer.self_attn
        q, k, v = a.rotated_qkv(h, cos, sin)
        keys = torch.cat([ring.k[layer_idx], k.transpose(0, 1).to(ring.k.dtype)], 1)
        vals = torch.cat([ring.v[layer_idx], v.transpose(0, 1).to(ring.v.dtype)], 1)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[None].to(q.dtype), vals[None].to(q.dtype),
            attn_mask=mask, scale=a.scale, enable_gqa=True,
        )  # fmt: skip
        if keep is not None:
            k, v = k[keep], v[keep]
        ring.k[layer_idx][:, dest] = k.transpose(0, 1).to(ring.k.dtype)
        ring.v[layer_idx][:, dest] = v.transpose(0, 1).to(ring.v.dtype)
        h = a.o_proj.forward(o[0].transpose(0, 1).reshape(T, a.q_size))
        h, residual = layer.post_attention_layernorm.forward(h, residual)
        x = layer.mlp.forward(h)
    ring.pos[dest] = pos if keep is None else pos[keep]
    hidden = model.norm(x[-1:], residual[-1:])[0]
    return model.compute_logits(hidden)[0].float()
