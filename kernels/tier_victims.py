"""The victims of the GPU tier's slot allocation (kernels.tier_alloc, the "value" eviction):
the m least valuable of S1 slots, m = the owners' count, by a radix select over chunks of
1,024 slots, one program each: 4 byte-wide histogram rounds into one global histogram, then
a count and a write pass (7 launches, no host read). Values are non-negative int32 (a
protected slot's: the int32 maximum). The reference is kernels.tier_alloc.least_valuable."""

from __future__ import annotations

import torch

from kernels import HAS_TRITON

VICTIMS_CHUNK = 1024  # slots per program of the victims' radix select

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _victims_threshold(HIST, m, ROUNDS: tl.constexpr):
        """The m-th smallest value's leading ROUNDS bytes (`prefix`) and how many values
        lie below them (`n_less`), from the global histograms of rounds 0..ROUNDS-1."""
        bins = tl.arange(0, 256)
        n_less = tl.zeros([], tl.int32)
        prefix = tl.zeros([], tl.int32)
        for r in tl.static_range(ROUNDS):
            hist = tl.load(HIST + r * 256 + bins)
            at_most = n_less + tl.cumsum(hist, 0)
            best = tl.min(tl.where(at_most >= m, bins, 255), 0)
            n_less += tl.sum(tl.where(bins < best, hist, 0), 0)
            prefix = (prefix << 8) | best
        return prefix, n_less

    @triton.jit
    def _victims_hist_kernel(VALUE, RANK, HIST, S1, n, ROUND: tl.constexpr,
                             CHUNK: tl.constexpr):  # fmt: skip
        """Round ROUND of the victims' radix select, one chunk of slots per program: the
        256-bin histogram of byte ROUND (from the top) of the values whose higher bytes
        equal the threshold's so far (every program derives it from the earlier rounds'
        histograms), added into HIST[ROUND]. Values are non-negative int32."""
        m = tl.load(RANK + n - 1).to(tl.int32)
        prefix, n_less = _victims_threshold(HIST, m, ROUND)
        s = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
        v = tl.load(VALUE + s, mask=s < S1, other=2147483647)
        byte = (v >> (24 - 8 * ROUND)) & 255
        if ROUND == 0:
            hist = tl.histogram(byte, 256, mask=s < S1)
        else:
            hist = tl.histogram(byte, 256, mask=(s < S1) & ((v >> (32 - 8 * ROUND)) == prefix))
        bins = tl.arange(0, 256)
        tl.atomic_add(HIST + ROUND * 256 + bins, hist, mask=hist > 0)

    @triton.jit
    def _victims_count_kernel(VALUE, RANK, HIST, COUNTS, S1, n, CHUNK: tl.constexpr):
        """Per chunk: the values below the m-th smallest (COUNTS[0, p]) and equal to it
        (COUNTS[1, p])."""
        m = tl.load(RANK + n - 1).to(tl.int32)
        prefix, n_less = _victims_threshold(HIST, m, 4)
        p = tl.program_id(0)
        s = p * CHUNK + tl.arange(0, CHUNK)
        v = tl.load(VALUE + s, mask=s < S1, other=2147483647)
        tl.store(COUNTS + p, tl.sum((v < prefix).to(tl.int32), 0))
        tl.store(COUNTS + tl.num_programs(0) + p, tl.sum((v == prefix).to(tl.int32), 0))

    @triton.jit
    def _victims_write_kernel(VALUE, RANK, HIST, COUNTS, VICTIMS, S1, n,
                              CHUNK: tl.constexpr, NP: tl.constexpr):  # fmt: skip
        """The victims, in slot order: every value below the m-th smallest, then its ties
        from the lowest slot; each program writes its chunk's after the earlier chunks'."""
        m = tl.load(RANK + n - 1).to(tl.int32)
        prefix, n_less = _victims_threshold(HIST, m, 4)
        ties_wanted = m - n_less
        P = tl.num_programs(0)
        p = tl.program_id(0)
        j = tl.arange(0, NP)
        less = tl.load(COUNTS + j, mask=j < P, other=0)
        ties = tl.load(COUNTS + P + j, mask=j < P, other=0)
        ties_before = tl.cumsum(ties, 0) - ties
        taken = less + tl.minimum(tl.maximum(ties_wanted - ties_before, 0), ties)
        base = tl.sum(tl.where(j < p, taken, 0), 0)
        tie_base = tl.sum(tl.where(j < p, ties, 0), 0)
        s = p * CHUNK + tl.arange(0, CHUNK)
        v = tl.load(VALUE + s, mask=s < S1, other=2147483647)
        tie = v == prefix
        tie_rank = tie_base + tl.cumsum(tie.to(tl.int32), 0) - 1
        chosen = (v < prefix) | (tie & (tie_rank < ties_wanted))
        pos = base + tl.cumsum(chosen.to(tl.int32), 0) - 1
        tl.store(VICTIMS + pos, s.to(tl.int64), mask=chosen)


def victims_triton(value, rank, S1: int, n: int, chunk: int = VICTIMS_CHUNK) -> torch.Tensor:
    """The m least valuable of S1 slots (m: rank's last entry; ties: the lowest slots), in
    slot order, then n - m entries left unwritten: a radix select over chunks of `chunk`
    slots, one program each (4 byte-wide histogram rounds into one global histogram, then
    a count and a write pass): 7 launches, no host read."""
    dev = value.device
    P = triton.cdiv(S1, chunk)
    hist = torch.zeros(4, 256, dtype=torch.int32, device=dev)
    counts = torch.empty(2, P, dtype=torch.int32, device=dev)
    victims = torch.empty(n, dtype=torch.long, device=dev)
    for r in range(4):
        _victims_hist_kernel[(P,)](value, rank, hist, S1, n, ROUND=r, CHUNK=chunk)
    _victims_count_kernel[(P,)](value, rank, hist, counts, S1, n, CHUNK=chunk)
    _victims_write_kernel[(P,)](value, rank, hist, counts, victims, S1, n, CHUNK=chunk,
                                NP=max(16, triton.next_power_of_2(P)))  # fmt: skip
    return victims
