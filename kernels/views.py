"""The small groups of tensors that the kernels' launchers take together (Liger-Kernel and
vLLM pass attention metadata the same way): a paged KV cache as a step reads it, the places
of a step's rows, a selection's page lists, a prefetch's stage, device counters, and how a
gather launches. Plain holders: the launchers check shapes and dtypes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# programs of a gather by default: with 4 units of 8 KB in flight each, 16 programs gather at
# 49.2 GB/s on the H200 (8: 48.8, 66: 49.4; cudaMemcpy 55.4) and leave the other 116 SMs to
# the work beside them (bench.gather_overlap, docs/benchmarks.md); EngineConfig sets it
GATHER_PROGRAMS = 16


@dataclass(frozen=True, slots=True)
class PageTable:
    """The sequences' pages: block_tables [B, M] int32 page ids, kv_lens [B] int32 tokens,
    page_size tokens per page."""

    block_tables: torch.Tensor
    kv_lens: torch.Tensor
    page_size: int


@dataclass(frozen=True, slots=True)
class PagedKV:
    """A paged KV cache as a decode step reads it: kv [N, Hkv, 2, P, D], block_tables
    [B, max_pages] int32, kv_lens [B] int32 (>= 1)."""

    kv: torch.Tensor
    block_tables: torch.Tensor
    kv_lens: torch.Tensor


@dataclass(frozen=True, slots=True)
class RowPlaces:
    """Where a step's N rows go: pages [N] int32 page ids, offsets [N] int32 within them."""

    pages: torch.Tensor
    offsets: torch.Tensor


@dataclass(frozen=True, slots=True)
class PageList:
    """The pages a sparse decode step reads per (sequence, KV head): units [B, Hkv, M]
    int32 (the pool rows), pages [B, Hkv, M] int32 (their page index in the sequence),
    counts [B, Hkv] int32 (the live entries); qmask [B, Hkv, M] int32 (optional): bit t
    of an entry says whether query t reads it."""

    units: torch.Tensor
    pages: torch.Tensor
    counts: torch.Tensor
    qmask: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class Stage:
    """Units a prefetch copied to the device: rows [R, 2, P, D], and row_of [U] int32 (each
    unit's row, NOT_STAGED where none)."""

    rows: torch.Tensor
    row_of: torch.Tensor


@dataclass(frozen=True, slots=True)
class Counters:
    """Device counters: acc [C] int64, and the indices `at` that a kernel adds its count to."""

    acc: torch.Tensor
    at: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GatherLaunch:
    """How a gather runs: on at most `programs` programs, `rows` units per program and round
    trip (None: as many as make 16K elements); use_triton None: on the GPU."""

    programs: int = GATHER_PROGRAMS
    rows: int | None = None
    use_triton: bool | None = None


@dataclass(frozen=True, slots=True)
class SelectRule:
    """What a selection keeps: `sink_pages` first pages, `window_pages` last pages, then the
    top-scoring others up to `budget` pages in all (pages of `page_size` tokens). `width`
    fixes the lists' width K (at least the budget) so nothing waits for the host and the
    call can be captured in a CUDA graph; None: K is the largest count."""

    page_size: int
    budget: int
    sink_pages: int = 1
    window_pages: int = 2
    width: int | None = None


@dataclass(frozen=True, slots=True)
class Selected:
    """A selection's page lists: pages [B, Hkv, W] int32 (columns of the page table, in
    ascending order), the first counts [B, Hkv] int32 of each row live."""

    pages: torch.Tensor
    counts: torch.Tensor


@dataclass(frozen=True, slots=True)
class SlotTable:
    """A layer's GPU tier: slots [S, 2, P, D] of page units, and slot_of [U] int32 (each
    unit's slot, -1: none)."""

    slots: torch.Tensor
    slot_of: torch.Tensor


@dataclass(frozen=True, slots=True)
class Resident:
    """Which units a layer holds on the GPU: slot_of [U + 1] int32 (-1: none), and the
    scratch unit (its last entry's index) that entries with nothing to do point at."""

    slot_of: torch.Tensor
    scratch_unit: int
