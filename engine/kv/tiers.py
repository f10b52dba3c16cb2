"""The tiered KV cache: a full host copy, a GPU working set of page slots, sparse decode.

Tiers:
- host tier: the paged pool [layers, pages, kv_heads, 2, P, D] that every K/V row is
  written to (write-through: nothing is lost when a slot is dropped). On a GPU machine it is
  meant to live in pinned host memory; on the CPU it is ordinary memory.
- GPU tier: per layer, a pool of `num_slots` page units [2, P, D] under a byte budget, and
  a page table `slot_of[layer, unit]` (unit = page * kv_heads + head; -1 = not resident).
  It holds the protected working set (this step's selected pages, which include the sinks
  and the local window) and, while room lasts, any other pages it held before (optional
  residency); those are shed first, least valuable first (recency, then how often they were
  selected), whenever the working set needs room.
- page summaries: per layer [units, 3, D] fp32 (min, max, sum of the page's keys), beside
  the GPU tier, updated on every append.

Decode attention of a layer (every sequence of the step with one new token, or T tokens of
a verification): score each (sequence, KV head)'s pages from the summaries with the GQA
group pooled, select sinks + window + top-k (+ an optional stochastic tail; or the oracle's
exact attention mass), fetch the selected pages that have no slot from the host, then run
the sparse decode kernel over the slots. The result is exactly sparse attention over the
selected pages. One selection may serve a group of consecutive layers.

Prefill stays dense and exact (engine.attention); its rows go to the host tier and the
summaries like any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.page_score import empty_summaries, page_scores, select_pages
from kernels.sparse_decode import sparse_decode_attention
from kernels.uva_gather import gather_pages


@dataclass
class SparseConfig:
    """Sparse attention and the GPU tier. Budgets: `budget_tokens` or `budget_fraction`
    of each sequence's pages (the larger wins when both are set), never fewer than the
    sinks + window + 1 pages."""

    budget_tokens: int | None = None
    budget_fraction: float | None = None
    sink_pages: int = 1
    window_pages: int = 2
    summary: str = "quest"  # "quest" (min/max bound) or "mean" (mean key)
    tail_pages: int = 0  # stochastic tail: extra pages sampled in proportion to exp(score)
    oracle: bool = False  # exact attention mass per page (evaluation only: reads every page)
    layer_group: int = 1  # consecutive layers that share one selection
    gpu_kv_budget: int | None = None  # bytes for the GPU slot pools; None: room for all pages
    seed: int = 0

    def __post_init__(self) -> None:
        if self.budget_tokens is None and self.budget_fraction is None:
            raise ValueError("set budget_tokens or budget_fraction")
        if self.budget_fraction is not None and not 0 < self.budget_fraction <= 1:
            raise ValueError(f"budget_fraction must be in (0, 1], got {self.budget_fraction}")
        if self.summary not in ("quest", "mean"):
            raise ValueError(f"summary must be quest or mean, got {self.summary!r}")
        if self.layer_group < 1 or self.sink_pages < 0 or self.window_pages < 1:
            raise ValueError("layer_group >= 1, sink_pages >= 0 and window_pages >= 1")

    def budget_pages(self, n_pages: int, page_size: int) -> int:
        want = 0
        if self.budget_tokens is not None:
            want = -(-self.budget_tokens // page_size)
        if self.budget_fraction is not None:
            want = max(want, math.ceil(self.budget_fraction * n_pages))
        return max(want, self.sink_pages + self.window_pages + 1)


@dataclass
class TierStats:
    """Counters since the last reset (engine.tier_stats())."""

    steps: int = 0  # sparse decode layer-steps
    selected: int = 0  # (sequence, head, page) selections
    fetched: int = 0  # of those, fetched from the host (missing on the GPU)
    fetched_bytes: int = 0
    evicted: int = 0
    max_selected: int = 0  # the most (sequence, head, page) selections of one layer-step
    # page-selection locality: of the pages selected at a layer, how many that layer had
    # selected at the step before (for the same sequence slot and head)
    locality_hits: int = 0
    locality_total: int = 0

    @property
    def locality(self) -> float:
        return self.locality_hits / self.locality_total if self.locality_total else 0.0

    @property
    def fetch_fraction(self) -> float:
        return self.fetched / self.selected if self.selected else 0.0


class TieredKV:
    def __init__(self, cfg, host_pool: torch.Tensor, page_size: int, sparse: SparseConfig,
                 device: torch.device) -> None:  # fmt: skip
        self.sparse = sparse
        self.L, self.num_pages, self.Hkv, _, self.P, self.D = host_pool.shape
        self.host = host_pool
        self.host_units = [layer.view(-1, 2, self.P, self.D) for layer in host_pool.unbind(0)]
        self.device = device
        self.unit_bytes = 2 * self.P * self.D * host_pool.element_size()
        units = self.num_pages * self.Hkv
        if sparse.gpu_kv_budget is None:
            self.num_slots = units
        else:
            self.num_slots = max(1, sparse.gpu_kv_budget // (self.L * self.unit_bytes))
        # one scratch entry past the end of the slots, the summaries and the recency
        # counters takes the writes of rows that have no slot / no reset, so appends and
        # bookkeeping need no host round trip
        self.scratch_slot, self.scratch_unit = self.num_slots, units
        self.slots = torch.zeros(
            self.L, self.num_slots + 1, 2, self.P, self.D, dtype=host_pool.dtype, device=device
        )
        self.slot_of = torch.full((self.L, units), -1, dtype=torch.int32, device=device)
        # host-side mirrors for allocation: which unit each slot holds, and the free slots
        self.unit_in = [[-1] * self.num_slots for _ in range(self.L)]
        self.free = [list(range(self.num_slots - 1, -1, -1)) for _ in range(self.L)]
        self.last_used = torch.zeros(self.L, self.num_slots + 1, dtype=torch.long, device=device)
        self.uses = torch.zeros(self.L, self.num_slots + 1, dtype=torch.long, device=device)
        self.summ = torch.stack([empty_summaries(units + 1, self.D, device) for _ in range(self.L)])
        self.clock = 0
        self._stats = TierStats()
        # device-side counters, read when `stats` is asked for
        self._acc = torch.zeros(
            4, dtype=torch.long, device=device
        )  # selected, max, loc hits, loc total
        self._group_selection: tuple | None = None
        self._previous: dict[int, tuple] = {}  # layer -> (page ids [B, Hkv, K], valid)
        self.step_max_len: int | None = None
        self._gen = torch.Generator(device=device).manual_seed(sparse.seed)

    # -- sizes for the meter ----------------------------------------------------------------

    def resident_units(self) -> int:
        return sum(self.num_slots - len(f) for f in self.free)

    @property
    def stats(self) -> TierStats:
        """The counters (reading the device-side ones waits for the device)."""
        selected, top, hits, total = self._acc.tolist()
        st = self._stats
        st.selected, st.locality_hits, st.locality_total = selected, hits, total
        st.max_selected = top
        return st

    def reset_stats(self) -> None:
        self._stats = TierStats()
        self._acc.zero_()
        self._previous = {}

    # -- appends ----------------------------------------------------------------------------

    def after_append(self, layer: int, k: torch.Tensor, v: torch.Tensor, pages: torch.Tensor,
                     offsets: torch.Tensor) -> None:  # fmt: skip
        """The step's rows are in the host pool (k, v [T, Hkv, D] at pages/offsets): fold
        their keys into the summaries and write them to any slot their page has. A page
        whose first row is written is a fresh page: its summary starts again. (Its slot, if
        it has one, stays: it still holds that page of that head, and rows are written in
        order, so every row a query can see is fresh.) No host round trip."""
        Hkv, D = self.Hkv, self.D
        heads = torch.arange(Hkv, device=self.device)
        pages_d, offs = pages.to(self.device).long(), offsets.to(self.device).long()
        units = (pages_d[:, None] * Hkv + heads).reshape(-1)  # [T * Hkv]
        fresh = (offs == 0)[:, None].expand(-1, Hkv).reshape(-1)
        s = self.summ[layer]
        first = torch.where(fresh, units, self.scratch_unit)
        s[first, 0] = float("inf")
        s[first, 1] = float("-inf")
        s[first, 2] = 0.0
        kf = k.float().reshape(-1, D).to(self.device)
        idx = units[:, None].expand(-1, D)
        s[:, 0].scatter_reduce_(0, idx, kf, "amin")
        s[:, 1].scatter_reduce_(0, idx, kf, "amax")
        s[:, 2].index_add_(0, units, kf)
        slot = self.slot_of[layer, units].long()
        dst = torch.where(slot >= 0, slot, self.scratch_slot)
        off = offs[:, None].expand(-1, Hkv).reshape(-1)
        self.slots[layer, dst, 0, off] = k.reshape(-1, D).to(self.device, self.slots.dtype)
        self.slots[layer, dst, 1, off] = v.reshape(-1, D).to(self.device, self.slots.dtype)

    def _drop(self, layer: int, units: torch.Tensor) -> None:
        slot = self.slot_of[layer, units]
        held = slot[slot >= 0].tolist()
        if not held:
            return
        self.slot_of[layer, units] = -1
        for s in held:
            self.unit_in[layer][s] = -1
            self.free[layer].append(s)

    # -- sparse decode ----------------------------------------------------------------------

    def attend(self, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
               kv_lens: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
        """q [B, T, Hq, D] (the last T positions of each sequence) -> [B, T, Hq, D]."""
        B, T, Hq, D = q.shape
        sp, P, Hkv = self.sparse, self.P, self.Hkv
        self.clock += 1
        if layer % sp.layer_group == 0 or self._group_selection is None:
            n_max = self.step_max_len or int(kv_lens.max())
            budget = min(sp.budget_pages(-(-n_max // P), P), block_tables.shape[1])
            if sp.oracle:
                scores = self._oracle_scores(layer, q, block_tables, kv_lens, scale)
            else:
                scores = page_scores(q, self.summ[layer], block_tables, kv_lens, P, Hkv, sp.summary)
            pages, counts = select_pages(
                scores, kv_lens, P, budget, sp.sink_pages, sp.window_pages, sp.tail_pages,
                generator=self._gen if sp.tail_pages else None,
                width=None if sp.tail_pages else budget,
            )  # fmt: skip
            self._group_selection = (pages, counts)
        pages, counts = self._group_selection
        # the units the step needs, and their slots (fetching what is missing)
        page_ids = torch.gather(block_tables.long(), 1, pages.reshape(B, -1).long())
        units = page_ids.view(B, Hkv, -1) * Hkv + torch.arange(Hkv, device=q.device)[None, :, None]
        width = pages.shape[-1]
        valid = torch.arange(width, device=q.device)[None, None, :] < counts[..., None]
        slots = self._ensure_resident(layer, units[valid])
        slot_lists = torch.zeros(B, Hkv, width, dtype=torch.int32, device=q.device)
        slot_lists[valid] = slots
        out = sparse_decode_attention(
            q.contiguous(), self.slots[layer], slot_lists, pages.to(torch.int32), counts,
            kv_lens.to(torch.int32), scale,
        )  # fmt: skip
        self._track_locality(layer, page_ids.view(B, Hkv, -1), valid)
        n_sel = counts.sum()
        self._acc[0] += n_sel
        self._acc[1] = torch.maximum(self._acc[1], n_sel)
        self._stats.steps += 1
        return out

    def _track_locality(self, layer: int, page_ids: torch.Tensor, valid: torch.Tensor) -> None:
        prev = self._previous.get(layer)
        self._previous[layer] = (page_ids, valid)
        if prev is None or prev[0].shape[:2] != page_ids.shape[:2]:
            return
        p_ids, p_valid = prev
        # [B, Hkv, K, K'] matches of this step's pages against the last step's
        same = (page_ids[..., :, None] == p_ids[..., None, :]) & p_valid[..., None, :]
        hit = same.any(-1) & valid
        self._acc[2] += hit.sum()
        self._acc[3] += valid.sum()

    def _ensure_resident(self, layer: int, units: torch.Tensor) -> torch.Tensor:
        """Slots of `units` (every one of them resident afterwards); missing ones are taken
        from the free list or from the least valuable pages not needed now, and fetched.
        One host round trip: the list of missing units."""
        slot = self.slot_of[layer, units]
        need = [u for u in torch.unique(torch.where(slot < 0, units, -1)).tolist() if u >= 0]
        if need:
            taken = self._take_slots(layer, len(need), slot)
            src = torch.tensor(need, dtype=torch.int32, device=self.device)
            dst = torch.tensor(taken, dtype=torch.int32, device=self.device)
            gather_pages(self.host_units[layer], self.slots[layer, : self.num_slots], src, dst)
            self.slot_of[layer, src.long()] = dst
            for u, s in zip(need, taken, strict=True):
                self.unit_in[layer][s] = u
            self._stats.fetched += len(need)
            self._stats.fetched_bytes += len(need) * self.unit_bytes
            slot = self.slot_of[layer, units]
        used = slot.long()
        self.last_used[layer].index_fill_(0, used, self.clock)
        self.uses[layer].index_add_(0, used, torch.ones_like(used))
        return slot

    def _take_slots(self, layer: int, n: int, wanted: torch.Tensor) -> list[int]:
        """n slots: free ones first, then the least valuable resident pages that this
        step does not read (`wanted`: the step's slots, -1 where missing)."""
        free = self.free[layer]
        taken = [free.pop() for _ in range(min(n, len(free)))]
        short = n - len(taken)
        if short:
            # shed optional residency: oldest use first, then the least used
            never = torch.iinfo(torch.long).max
            value = self.last_used[layer] * (1 << 20) + self.uses[layer].clamp(max=(1 << 20) - 1)
            value[self.scratch_slot] = never
            value.index_fill_(0, torch.where(wanted >= 0, wanted, self.scratch_slot).long(), never)
            if taken:
                value[torch.tensor(taken, device=self.device)] = never
            if int((value < never).sum()) < short:
                from engine.errors import CacheFullError

                free.extend(reversed(taken))  # nothing was used
                raise CacheFullError(
                    f"the GPU KV budget holds {self.num_slots} pages per layer, fewer than "
                    "this step's selected pages: raise --gpu-kv-budget or lower the sparse budget"
                )
            victims = torch.topk(value, short, largest=False).indices.tolist()
            for s in victims:
                u = self.unit_in[layer][s]
                if u >= 0:
                    self.slot_of[layer, u] = -1
                self.unit_in[layer][s] = -1
                self.uses[layer, s] = 0
            self._stats.evicted += len(victims)
            taken += victims
        return taken

    def _oracle_scores(self, layer, q, block_tables, kv_lens, scale) -> torch.Tensor:
        """Exact attention mass per page (GQA group summed, max over the T queries)."""
        B, T, Hq, D = q.shape
        P, Hkv, G = self.P, self.Hkv, Hq // self.Hkv
        M = block_tables.shape[1]
        out = torch.full((B, Hkv, M), float("-inf"), device=q.device)
        host = self.host[layer]  # [pages, Hkv, 2, P, D]
        for b in range(B):
            n = int(kv_lens[b])
            n_pages = -(-n // P)
            pg = block_tables[b, :n_pages].long().to(host.device)
            k = host[pg][:, :, 0].permute(1, 0, 2, 3).reshape(Hkv, n_pages * P, D)[:, :n]
            k = k.float().to(q.device)
            qh = q[b].float().view(T, Hkv, G, D)
            logits = torch.einsum("thgd,hkd->thgk", qh, k) * scale
            q_pos = torch.arange(n - T, n, device=q.device)
            causal = torch.arange(n, device=q.device)[None, :] <= q_pos[:, None]
            logits = logits.masked_fill(~causal[:, None, None, :], float("-inf"))
            mass = torch.softmax(logits, -1).sum(2)  # [T, Hkv, n]
            mass = torch.nn.functional.pad(mass, (0, n_pages * P - n)).view(T, Hkv, n_pages, P)
            out[b, :, :n_pages] = mass.sum(-1).amax(0)
        return out

    def end_step(self, max_len: int | None = None) -> None:
        """A new step begins; `max_len`: its longest sequence (saves a device read)."""
        self._group_selection = None
        self.step_max_len = max_len
