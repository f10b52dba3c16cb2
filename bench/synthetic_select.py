"""Benchmarks' synthetic page scores for a verification's queries (dummy weights carry no
attention to select by; bench.scorers.SyntheticScorer draws scores with the locality
measured on the real model instead).

Query 0 of each sequence takes the step's draw `first` as it is; each later query drops
each page with probability 0.15 (its score - 4: it loses to every unselected page) and,
with `recurring`, lifts pages read at earlier steps (`seen`, + 1) so that about
`recurring` of the pages replacing the dropped ones are pages read before (about 0.15 x
budget x recurring lifted outside query 0's selection).

`synthetic_query_scores_reference` in torch (~24 kernels per layer); on a GPU one Triton
kernel does it (a program per block of 1,024 pages of a (sequence, query, head) row), seeded by the engine's step
clock and the layer, so a CUDA graph draws afresh at each replay. The two draw different
random numbers, with the same distribution (tests/bench/test_synthetic_select.py).
"""

from __future__ import annotations

import torch

from kernels import HAS_TRITON

DROP = 0.15  # each later query's share of query 0's pages replaced (the real model's 81-87%)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _synthetic_query_kernel(FIRST, SEEN, N_SEEN, BUDGETS, OUT, CLOCK, salt, M, recurring,
                                s_sb, s_sh, T, HKV: tl.constexpr, RECURRING: tl.constexpr,
                                DROP_P: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        r = tl.program_id(0)  # ((b * T) + t) * HKV + h
        h = r % HKV
        bt = r // HKV
        t = bt % T
        b = bt // T
        later = t != 0
        src = FIRST + (b * HKV + h).to(tl.int64) * M
        dst = OUT + r.to(tl.int64) * M
        seen_row = SEEN + b.to(tl.int64) * s_sb + h * s_sh
        seed = tl.load(CLOCK) * 1000003 + salt
        o = tl.arange(0, BLOCK)
        p_lift = 0.0
        if RECURRING:
            n_seen = tl.load(N_SEEN + b * HKV + h)
            bud = tl.load(BUDGETS + bt).to(tl.float32)
            free = tl.maximum(n_seen.to(tl.float32) - bud, 1.0)
            p_lift = tl.minimum(recurring * DROP_P * bud / free, 1.0)
        page = tl.program_id(1) * BLOCK + o  # this program's block of the row
        inside = page < M
        s = tl.load(src + page, mask=inside, other=0.0)
        at = (r * M + page) * 2
        drop = (tl.rand(seed, at) < DROP_P) & later
        s = tl.where(drop, s - 4.0, s)
        if RECURRING:
            seen = tl.load(seen_row + page, mask=inside, other=0) != 0
            lift = seen & later & (tl.rand(seed, at + 1) < p_lift)
            s = tl.where(lift, s + 1.0, s)
        tl.store(dst + page, s, mask=inside)


def synthetic_query_scores_reference(first: torch.Tensor, T: int, budgets: torch.Tensor,
                                     seen: torch.Tensor | None = None,
                                     recurring: float = 0.0) -> torch.Tensor:  # fmt: skip
    """first [B, Hkv, M] fp32: the step's draw; budgets [B * T]: each query's page budget;
    seen [B, Hkv, >= M] bool: the pages each row read at any earlier step (with
    `recurring`) -> scores [B * T, Hkv, M]."""
    BT, dev = first.shape[0] * T, first.device
    M = first.shape[-1]
    scores = first.repeat_interleave(T, 0)
    later = (torch.arange(BT, device=dev) % T != 0)[:, None, None]
    drop = torch.rand(scores.shape, device=dev) < DROP
    scores = scores - 4.0 * (drop & later).float()
    if recurring and seen is not None:
        seen = seen[..., :M].repeat_interleave(T, 0)
        want = recurring * DROP * budgets.float()[:, None, None]
        # (over the seen pages outside query 0's selection, which most of it is in)
        free = seen.sum(-1, keepdim=True) - budgets[:, None, None]
        p = (want / free.clamp(min=1)).clamp(max=1)
        lift = seen & later & (torch.rand(scores.shape, device=dev) < p)
        scores = scores + lift.float()
    return scores


def synthetic_query_scores(first: torch.Tensor, T: int, budgets: torch.Tensor,
                           seen: torch.Tensor | None = None, recurring: float = 0.0,
                           clock: torch.Tensor | None = None, salt: int = 0,
                           use_triton: bool | None = None) -> torch.Tensor:  # fmt: skip
    """The reference's draw; on a GPU (or `use_triton`) with `clock` (an int64 device scalar
    that changes between calls: the engine's step counter) the Triton kernel, seeded by
    clock and `salt` (the layer)."""
    on = use_triton if use_triton is not None else first.is_cuda
    if not HAS_TRITON or not on or clock is None:
        return synthetic_query_scores_reference(first, T, budgets, seen, recurring)
    B, Hkv, M = first.shape
    lifting = bool(recurring) and seen is not None
    if lifting and (seen.shape[:2] != (B, Hkv) or seen.shape[-1] < M or seen.stride(-1) != 1):
        raise ValueError(f"seen {tuple(seen.shape)} is not [{B}, {Hkv}, >= {M}] (rows dense)")
    out = torch.empty(B * T, Hkv, M, dtype=torch.float32, device=first.device)
    seen_u8 = seen.view(torch.uint8) if lifting else out
    # each row's count of pages read before, once (not in each of its programs)
    n_seen = seen[..., :M].sum(-1, dtype=torch.int32).contiguous() if lifting else out
    block = 1024
    _synthetic_query_kernel[(B * T * Hkv, triton.cdiv(M, block))](
        first.float().contiguous(), seen_u8, n_seen, budgets.to(torch.int32).contiguous(), out,
        clock, salt, M, float(recurring), seen_u8.stride(0), seen_u8.stride(1), T, HKV=Hkv,
        RECURRING=lifting, DROP_P=DROP, BLOCK=block,
    )  # fmt: skip
    return out
