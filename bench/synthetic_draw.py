"""Benchmarks' synthetic page scores for a decode step (bench.scorers.SyntheticScorer): each
page's score is uniform in [0, 1), plus 2 for a page the row read at this layer at the step
before, with probability `keep` (so it wins again); what a row read is kept as the step
that read it (`stamp` [rows, Hkv, >= M] int32), so recording a step's pages is one scatter
and nothing is cleared.

`draw_reference` / `stamp_reference` in torch (~8 kernels a layer); on a GPU one Triton
kernel each, seeded by the engine's step clock and the layer, so a CUDA graph draws afresh
at each replay. The two draw different random numbers with the same rules
(tests/bench/test_synthetic_draw.py).
"""

from __future__ import annotations

import torch

from kernels import HAS_TRITON

NEVER = torch.iinfo(torch.int32).min  # a stamp: never read (no step's clock - 1)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _synthetic_draw_kernel(STAMP, OUT, CLOCK, salt, M, keep, s_sb, s_sh,
                               HKV: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        r = tl.program_id(0)  # b * HKV + h
        b = r // HKV
        h = r % HKV
        page = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = page < M
        clock = tl.load(CLOCK)
        seed = clock * 1000003 + salt
        at = (r * M + page) * 2
        last = tl.load(STAMP + b * s_sb + h * s_sh + page, mask=inside, other=-1)
        kept = (last == (clock - 1).to(tl.int32)) & (tl.rand(seed, at + 1) < keep)
        tl.store(OUT + r.to(tl.int64) * M + page, tl.rand(seed, at) + 2.0 * kept.to(tl.float32),
                 mask=inside)  # fmt: skip

    @triton.jit
    def _synthetic_stamp_kernel(PAGES, VALID, STAMP, CLOCK, W, s_pb, s_ph, s_vb, s_vh, s_sb,
                                s_sh, HKV: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        r = tl.program_id(0)
        b = r // HKV
        h = r % HKV
        step = tl.load(CLOCK).to(tl.int32)
        for start in range(0, W, BLOCK):
            j = start + tl.arange(0, BLOCK)
            m = j < W
            valid = tl.load(VALID + b * s_vb + h * s_vh + j, mask=m, other=0) != 0
            page = tl.load(PAGES + b * s_pb + h * s_ph + j, mask=m & valid, other=0)
            tl.store(STAMP + b * s_sb + h * s_sh + page, step, mask=m & valid)


def draw_reference(stamp: torch.Tensor, clock: torch.Tensor, keep: float, M: int) -> torch.Tensor:
    """Scores [rows, Hkv, M] fp32 (stamp: [rows, Hkv, >= M] int32, the step each page was
    last read at)."""
    rows, Hkv = stamp.shape[:2]
    dev = stamp.device
    read_last = stamp[..., :M] == (clock - 1).to(torch.int32)
    kept = read_last & (torch.rand(rows, Hkv, M, device=dev) < keep)
    return torch.rand(rows, Hkv, M, device=dev) + 2.0 * kept.float()


def stamp_reference(stamp: torch.Tensor, pages: torch.Tensor, valid: torch.Tensor,
                    clock: torch.Tensor) -> None:  # fmt: skip
    """stamp[row, h, pages[row, h, j]] = the step, where valid (pages, valid [rows, Hkv, W])."""
    none = stamp.shape[-1] - 1  # (a column past every page: the invalid entries' place)
    at = torch.where(valid, pages.long(), none)
    stamp.scatter_(-1, at, clock.to(torch.int32).expand(at.shape))
    stamp[..., none].fill_(NEVER)


def synthetic_draw(stamp: torch.Tensor, clock: torch.Tensor, keep: float, M: int, salt: int = 0,
                   use_triton: bool | None = None) -> torch.Tensor:  # fmt: skip
    """The decode step's scores: draw_reference's rules, by the kernel on a GPU (or
    `use_triton`), seeded by `clock` and `salt` (the layer)."""
    if not (HAS_TRITON and (use_triton if use_triton is not None else stamp.is_cuda)):
        return draw_reference(stamp, clock, keep, M)
    rows, Hkv = stamp.shape[:2]
    assert stamp.dtype == torch.int32 and stamp.stride(-1) == 1 and stamp.shape[-1] >= M
    out = torch.empty(rows, Hkv, M, dtype=torch.float32, device=stamp.device)
    block = 1024
    _synthetic_draw_kernel[(rows * Hkv, triton.cdiv(M, block))](
        stamp, out, clock, salt, M, float(keep), stamp.stride(0), stamp.stride(1), HKV=Hkv,
        BLOCK=block,
    )  # fmt: skip
    return out


def synthetic_stamp(stamp: torch.Tensor, pages: torch.Tensor, valid: torch.Tensor,
                    clock: torch.Tensor, use_triton: bool | None = None) -> None:  # fmt: skip
    """Record a step's pages (stamp_reference), by the kernel on a GPU (or `use_triton`)."""
    if not (HAS_TRITON and (use_triton if use_triton is not None else stamp.is_cuda)):
        return stamp_reference(stamp, pages, valid, clock)
    rows, Hkv, W = pages.shape
    assert pages.stride(-1) == 1 and valid.stride(-1) == 1 and stamp.stride(-1) == 1
    valid_u8 = valid.view(torch.uint8)
    _synthetic_stamp_kernel[(rows * Hkv,)](
        pages, valid_u8, stamp, clock, W, pages.stride(0), pages.stride(1), valid_u8.stride(0),
        valid_u8.stride(1), stamp.stride(0), stamp.stride(1), HKV=Hkv, BLOCK=256,
    )  # fmt: skip
