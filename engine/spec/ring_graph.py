"""Greedy draft tokens over a draft ring in a CUDA graph.

On a GPU an eager one-token forward of a small model is launch-bound: Qwen2.5-Coder-0.5B's
24 layers are ~300 kernel launches, several milliseconds from Python, more than the target's
whole decode step in its graph (1.6-1.9 ms). So a drafter drafts through one graph per ring:
one token's pass over the ring (engine.spec.ring.ring_layers on static inputs), its argmax
written back as the next replay's input. A draft of k tokens is k replays and one read of
the tokens at the end. The graph reads the ring's own tensors: it serves that ring only (a
sequence's, for its life).
"""

from __future__ import annotations

import torch

from engine.spec.ring import RingKV, ring_layers


class RingStepGraph:
    """One greedy draft step over `ring`, captured once: `step(pos, dest, i)` runs the token
    in `self.ids` at position `pos`, stores its KV at ring entry `dest` and leaves the
    argmax token in `self.ids` and in `out[i]`. capture=False: the same steps, eagerly."""

    def __init__(self, model, rope, ring: RingKV, max_k: int, pool=None,
                 capture: bool = True) -> None:  # fmt: skip
        dev = ring.k.device
        self.ring = ring  # (the one its graph reads)
        self.ids = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.dest = torch.zeros(1, dtype=torch.long, device=dev)
        self.out = torch.zeros(max_k, dtype=torch.long, device=dev)
        scratch = ring.k.shape[2] - 1  # the last tail entry: empty between drafts
        self.dest.fill_(scratch)

        def body() -> None:
            logits = ring_layers(model, rope, ring, self.ids, self.pos, self.dest)
            self.ids.copy_(logits.argmax(-1, keepdim=True))

        self.body, self.graph = body, None
        if not capture:  # (the same steps run eagerly: a CPU, or a check of the graph)
            return
        side = torch.cuda.Stream(dev)  # warm-up (lazy kernel builds) outside the capture
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.inference_mode(), torch.cuda.stream(side):
            body()
        torch.cuda.current_stream(dev).wait_stream(side)
        ring.pos[scratch] = -1  # (the warm-up's entry: empty again)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph, pool=pool):
            body()

    def step(self, pos: int, dest: int, i: int) -> None:
        """Replay at position `pos` into ring entry `dest`; token i of the draft is kept."""
        self.pos.fill_(pos)
        self.dest.fill_(dest)
        if self.graph is None:
            with torch.inference_mode():
                self.body()
        else:
            self.graph.replay()
        self.out[i : i + 1].copy_(self.ids)

    def draft(self, first: int, pos: int, dest: int, k: int, to_tail: bool) -> list[int]:
        """k greedy tokens: the first from token `first` at `pos` into `dest` (the tail when
        `to_tail`), the rest fed back into the tail."""
        ring = self.ring
        self.ids.fill_(first)
        self.step(pos, dest, 0)
        ring.tail_len += int(to_tail)
        for i in range(1, k):
            self.step(pos + i, ring.tail_index(1)[0], i)
            ring.tail_len += 1
        return self.out[:k].tolist()
