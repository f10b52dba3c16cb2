"""The union of a verification's per-query page selections, with a bit per query.

A verification runs T queries per sequence (its last token and k drafted ones); each query
selects its pages as a one-token step at its own position would, and the T selections of a
(sequence, KV head) are listed once, in page order, each page with the bits of the queries
that chose it (`qmask`, bit t: query t), so the missing pages are fetched once and the
attention kernel masks each query to its own pages.

`union_pages_reference` builds it in torch (a bitmap per row, a cumulative sum and two
scatters: ~25 kernels per layer, which at batch 1 on the H200 cost more than the fetch they
save: an H200 profile). The Triton version is two kernels: one
program per (sequence, query, head) sets its query's bit at each of its pages in a scratch
bitmap (atomic or); one program per (sequence, head) walks the bitmap in page order, writes
the listed pages, their bits and the count, clears the bitmap for the next call and flags a
union wider than the fixed width (a CUDA graph's). (Tried on the H200: one kernel per
(sequence, head) that sorts the entries no lower query chose, with no walk of the row: 19
us per layer at 8,196 pages against the walk's 10 us plus the marking's ~3.)
"""

from __future__ import annotations

import torch

from kernels import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _union_mark_kernel(PAGES, COUNTS, BITS, K, M, T, HKV: tl.constexpr,
                           BLOCK: tl.constexpr):  # fmt: skip
        r = tl.program_id(0)  # ((b * T) + t) * HKV + h: one query's selection of one head
        h = r % HKV
        t = (r // HKV) % T
        b = r // (HKV * T)
        n = tl.load(COUNTS + r)
        bit = tl.full([BLOCK], 1, tl.int32) << t
        o = tl.arange(0, BLOCK)
        row = BITS + (b * HKV + h).to(tl.int64) * M
        for start in range(0, K, BLOCK):
            at = start + o
            mine = (at < n) & (at < K)
            page = tl.load(PAGES + r.to(tl.int64) * K + at, mask=mine, other=0)
            tl.atomic_or(row + page, bit, mask=mine)

    @triton.jit
    def _union_compact_kernel(BITS, OUT, QMASK, CNT, OVERFLOW, M, W, CH: tl.constexpr):
        r = tl.program_id(0)  # b * HKV + h
        row = BITS + r.to(tl.int64) * M
        out = OUT + r.to(tl.int64) * W
        qm = QMASK + r.to(tl.int64) * W
        o = tl.arange(0, CH)
        n = tl.zeros([], tl.int32)
        for start in range(0, M, CH):
            page = start + o
            bits = tl.load(row + page, mask=page < M, other=0)
            listed = bits != 0
            col = n + tl.cumsum(listed.to(tl.int32), 0) - 1
            keep = listed & (col < W)
            tl.store(out + col, page, mask=keep)
            tl.store(qm + col, bits, mask=keep)
            tl.store(row + page, tl.zeros([CH], tl.int32), mask=listed)  # clean for next time
            n += tl.sum(listed.to(tl.int32), 0)
        for start in range(0, W, CH):  # columns past the union read 0s
            col = start + o
            past = (col >= n) & (col < W)
            tl.store(out + col, tl.zeros([CH], tl.int32), mask=past)
            tl.store(qm + col, tl.zeros([CH], tl.int32), mask=past)
        tl.store(CNT + r, tl.minimum(n, W))
        tl.atomic_max(OVERFLOW, (n > W).to(tl.int32))


def union_pages_reference(pages: torch.Tensor, counts: torch.Tensor, T: int, M: int,
                          width: int | None = None,
                          overflow: torch.Tensor | None = None):  # fmt: skip
    """pages [B * T, Hkv, K] (query t of sequence b at row b * T + t; each row's pages
    distinct, entries past its count ignored), counts [B * T, Hkv], M: pages per row of
    the block table -> (pages [B, Hkv, W] int32 ascending, counts [B, Hkv] int32, qmask
    [B, Hkv, W] int32), entries past a count 0. `width`: W fixed (a CUDA graph's: a
    longer union is cut, and `overflow` (int32 scalar) set to 1); None: the longest union
    (a device read)."""
    BT, Hkv, K = pages.shape
    B, dev = BT // T, pages.device
    valid = torch.arange(K, device=dev)[None, None, :] < counts[..., None]
    at = torch.where(valid, pages.long(), M).view(B, T, Hkv, K).transpose(1, 2)
    bit = (1 << torch.arange(T, device=dev, dtype=torch.int32))[None, None, :, None]
    bit = torch.where(valid.view(B, T, Hkv, K).transpose(1, 2), bit, 0)
    bits = torch.zeros(B, Hkv, M + 1, dtype=torch.int32, device=dev)
    bits.scatter_add_(-1, at.reshape(B, Hkv, -1), bit.reshape(B, Hkv, -1))
    bits = bits[..., :M]
    listed = bits != 0
    n_union = listed.sum(-1, dtype=torch.int32)
    if width is None:
        width = max(1, int(n_union.max()))
    elif overflow is not None:
        overflow |= (n_union > width).any().to(torch.int32)
    # compaction in page order: listed page i goes to column (listed pages before i)
    col = torch.where(listed, torch.cumsum(listed, -1, dtype=torch.int32) - 1, width)
    col = col.clamp(max=width).long()
    out_pages = torch.zeros(B, Hkv, width + 1, dtype=torch.int32, device=dev)
    out_pages.scatter_(-1, col, torch.arange(M, device=dev, dtype=torch.int32).expand(B, Hkv, M))
    qmask = torch.zeros(B, Hkv, width + 1, dtype=torch.int32, device=dev)
    qmask.scatter_(-1, col, bits)
    # (column `width` took every unlisted page)
    pages_u, qmask = out_pages[..., :width].contiguous(), qmask[..., :width].contiguous()
    return pages_u, n_union.clamp(max=width), qmask


def union_pages(pages: torch.Tensor, counts: torch.Tensor, T: int, M: int,
                width: int | None = None, overflow: torch.Tensor | None = None,
                scratch: torch.Tensor | None = None, use_triton: bool | None = None):  # fmt: skip
    """union_pages_reference's result; with a fixed `width`, on a GPU (or `use_triton`),
    two Triton kernels. `scratch`: int32, at least B * Hkv * M elements, all zero (and
    left so): the bitmap (a CUDA graph's must outlive it); None: a fresh one."""
    on = use_triton if use_triton is not None else pages.is_cuda
    if width is None or not HAS_TRITON or not on:
        return union_pages_reference(pages, counts, T, M, width, overflow)
    BT, Hkv, K = pages.shape
    B, dev = BT // T, pages.device
    if T > 31:
        raise ValueError(f"a union of at most 31 queries (int32 bits), not {T}")
    if scratch is None:
        scratch = torch.zeros(B * Hkv * M, dtype=torch.int32, device=dev)
    elif scratch.numel() < B * Hkv * M or scratch.dtype != torch.int32:
        raise ValueError(f"the union's scratch holds {scratch.numel()} int32, not {B * Hkv * M}")
    if overflow is None:
        overflow = torch.zeros((), dtype=torch.int32, device=dev)
    out = torch.empty(B, Hkv, width, dtype=torch.int32, device=dev)
    qmask = torch.empty(B, Hkv, width, dtype=torch.int32, device=dev)
    n = torch.empty(B, Hkv, dtype=torch.int32, device=dev)
    pages = pages.to(torch.int32).contiguous()
    counts = counts.to(torch.int32).contiguous()
    block = min(1024, triton.next_power_of_2(max(K, 16)))
    _union_mark_kernel[(BT * Hkv,)](pages, counts, scratch, K, M, T, HKV=Hkv, BLOCK=block)
    _union_compact_kernel[(B * Hkv,)](scratch, out, qmask, n, overflow, M, width, CH=4096,
                                      num_warps=8)  # fmt: skip
    return out, n, qmask
