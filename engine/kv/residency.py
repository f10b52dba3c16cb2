"""The GPU tier's residency: per layer, a pool of page slots under a byte budget, the page
table between units (unit = page * kv_heads + head) and slots, and the eviction policy.

A slot holds one unit's [2, P, D] rows. The slots a step reads are protected; the others
keep the pages they held (optional residency) until a miss needs the room, and then the
least valuable go first: free slots, then the oldest last read, then the fewest reads
(kernels.tier_alloc). One scratch entry past the end of the slots and of the page table
takes the writes of rows that have no slot and the reads of unused selection entries, so
a decode step needs no host round trip (and can be a CUDA graph). The scratch unit always
sits in the scratch slot.

Which implementation allocates is the engine's choice (`SlotAllocator`): the kernels on a
GPU, their torch reference on the CPU or where `kernels` is off; and, where this Triton
cannot build the victims' select (Triton < 3.4: no masks), the torch victims from then on.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from engine.kv.sparse_config import C
from kernels import HAS_TRITON
from kernels.tier_alloc import (
    NO_CLAIM,
    LayerState,
    allocate_reference,
    allocate_triton,
    least_valuable,
)
from kernels.tier_clock import allocate_clock_reference, allocate_clock_triton
from kernels.tier_victims import victims_triton
from kernels.views import GATHER_PROGRAMS, Stage


class SlotAllocator:
    """Makes a layer's listed units resident (kernels.tier_alloc), by kernels or by their
    reference; the victims kernel stays in use until it fails to build once."""

    def __init__(self, kernels: bool = True, gather_programs: int = GATHER_PROGRAMS) -> None:
        self.kernels = kernels  # on a GPU: the Triton kernels (False: the torch reference)
        self.gather_programs = gather_programs  # the UVA gather's programs (EngineConfig)
        self.victims_kernel = True  # False once the victims kernels failed to build

    def allocate(self, st: LayerState, units: torch.Tensor, valid: torch.Tensor,
                 acc: torch.Tensor, stage: Stage | None = None,
                 before_gather: Callable[[], None] | None = None) -> torch.Tensor:  # fmt: skip
        """The value eviction, or the CLOCK eviction where the layer has its hand."""
        kernels = HAS_TRITON and self.kernels and units.is_cuda
        if st.hand is not None:
            clock = allocate_clock_triton if kernels else allocate_clock_reference
            return clock(st, units, valid, acc, C, stage, before_gather)
        if kernels:
            return allocate_triton(st, units, valid, acc, C, stage, before_gather,
                                   victims=self.victims)  # fmt: skip
        return allocate_reference(st, units, valid, acc, C, stage, before_gather)

    def victims(self, value, owner, rank, S1: int, n: int) -> torch.Tensor:
        """The victims from the radix-select kernels, or from their reference where this
        Triton cannot build them (the same slots; a warning once). The first call is an
        eager step's, never a graph capture's."""
        if self.victims_kernel:
            try:
                return victims_triton(value, rank, S1, n)
            except Exception as e:  # noqa: BLE001 (a compile error: any of Triton's kinds)
                self.victims_kernel = False
                warnings.warn(f"the victims kernels did not build ({type(e).__name__}); "
                              "using torch for them", RuntimeWarning, stacklevel=2)  # fmt: skip
        return least_valuable(value, owner)


class Residency:
    """Slots, page table and eviction state of every layer (all on the device).

    slot_of[layer, unit]: the unit's slot or -1; unit_in[layer, slot]: the slot's unit or
    -1 (free); last_used: the step a slot was last read at (-1: free), uses: its read count
    (the eviction value); claim: which entry of a call owns a unit listed twice (the first);
    clock: decode steps."""

    def __init__(self, host_pool: torch.Tensor, num_slots: int, device: torch.device,
                 acc: torch.Tensor, allocator: SlotAllocator | None = None,
                 eviction: str = "value") -> None:  # fmt: skip
        L, num_pages, Hkv, _, P, D = host_pool.shape
        units = num_pages * Hkv
        self.L, self.num_slots, self.device, self.acc = L, num_slots, device, acc
        self.allocator = allocator or SlotAllocator()
        self.host_units = [layer.view(-1, 2, P, D) for layer in host_pool.unbind(0)]
        self.scratch_slot, self.scratch_unit = num_slots, units
        self.slots = torch.zeros(L, num_slots + 1, 2, P, D, dtype=host_pool.dtype, device=device)
        self.slot_of = torch.full((L, units + 1), -1, dtype=torch.int32, device=device)
        self.slot_of[:, self.scratch_unit] = self.scratch_slot
        self.unit_in = torch.full((L, num_slots + 1), -1, dtype=torch.long, device=device)
        self.unit_in[:, self.scratch_slot] = self.scratch_unit
        self.last_used = torch.full((L, num_slots + 1), -1, dtype=torch.long, device=device)
        self.uses = torch.zeros(L, num_slots + 1, dtype=torch.long, device=device)
        self.claim = torch.full((units + 1,), NO_CLAIM, dtype=torch.long, device=device)
        self.clock = torch.zeros((), dtype=torch.long, device=device)
        self.marks: torch.Tensor | None = None  # the CLOCK eviction's (set_eviction)
        self.hand: torch.Tensor | None = None
        self.set_eviction(eviction)

    def set_eviction(self, eviction: str) -> None:
        """The eviction from the next allocation on: "value" (the least valuable slots,
        kernels.tier_alloc) or "clock" (a hand over the ring of slots, kernels.tier_clock)."""
        if eviction == "clock" and self.hand is None:
            L, S1 = self.unit_in.shape
            self.marks = torch.full((L, S1), -1, dtype=torch.int32, device=self.device)
            self.hand = torch.zeros(L, dtype=torch.long, device=self.device)
        elif eviction == "value":
            self.marks = self.hand = None

    def layer(self, layer: int) -> LayerState:
        clock = self.hand is not None
        return LayerState(self.slot_of[layer], self.unit_in[layer], self.last_used[layer],
                          self.uses[layer], self.host_units[layer], self.slots[layer],
                          self.claim, self.clock, self.allocator.gather_programs,
                          marks=self.marks[layer] if clock else None,
                          hand=self.hand[layer] if clock else None)  # fmt: skip

    def resident_units(self) -> int:
        return int((self.unit_in[:, : self.num_slots] >= 0).sum())

    def ensure_resident(self, layer: int, units: torch.Tensor, valid: torch.Tensor,
                        stage: Stage | None = None,
                        before_gather: Callable[[], None] | None = None) -> torch.Tensor:  # fmt: skip
        """Slots [N] int32 of `units` [N] (entries where `valid` is false read the scratch
        slot); every valid unit is resident afterwards. Missing units take the least
        valuable slots that this step does not read (free ones first, then the oldest last
        use, then the fewest uses) and are fetched from `stage` (a prefetch's: rows,
        row_of) or, failing that, from the host with the UVA gather; `before_gather` runs
        just before that gather. All on the device: fixed shapes, no host round trip."""
        return self.allocator.allocate(self.layer(layer), units, valid, self.acc, stage,
                                       before_gather)  # fmt: skip

    def drop_pages(self, pages: list[int], Hkv: int) -> None:
        """Pages that left their sequence (rolled back): free their slots in every layer,
        all layers in one pass."""
        if not pages:
            return
        pg = torch.tensor(pages, device=self.device)
        units = (pg[:, None] * Hkv + torch.arange(Hkv, device=self.device)).reshape(-1)
        slot = self.slot_of[:, units].long()  # [L, n]
        self.acc[C["dropped"]] += (slot >= 0).sum()
        s = torch.where(slot >= 0, slot, self.scratch_slot)
        self.unit_in.scatter_(1, s, -1)
        self.last_used.scatter_(1, s, -1)
        self.uses.scatter_(1, s, 0)
        self.slot_of.index_fill_(1, units, -1)
        self.unit_in[:, self.scratch_slot].fill_(self.scratch_unit)
