"""A step's host-side inputs, built from the scheduler's output: per token its id, position
and KV slot; per sequence its query and KV lengths and the pages it reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.runtime.scheduler import SchedulerOutput


@dataclass(slots=True)
class StepShape:
    """What graph eligibility reads of a step: each sequence's query and KV length."""

    query_lens: list[int] = field(default_factory=list)
    kv_lens: list[int] = field(default_factory=list)  # KV length after the step's tokens

    @property
    def batch_size(self) -> int:
        return len(self.query_lens)


@dataclass(slots=True)
class StepInputs(StepShape):
    """Per token: its id, position, KV page and offset in it, and the length rope reads;
    per sequence: the pages it reads (`page_lists`), its own block table (the list object:
    a verification graph's staging keeps the rows of a table it wrote before) and how many
    leading pages hold committed tokens, which cannot change before its next step."""

    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    rope_lens: list[int] = field(default_factory=list)
    sample_idx: list[int] = field(default_factory=list)  # the rows whose logits are sampled
    page_lists: list[list[int]] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    stable_pages: list[int] = field(default_factory=list)


def prepare(out: SchedulerOutput, page_size: int, ahead: bool = False) -> StepInputs:
    """The step's inputs. ahead: the step after the one in flight, whose input tokens are
    still on the device (positions one further; ids are placeholders)."""
    b = StepInputs()
    P = page_size
    for item in out.scheduled:
        seq, start, n = item.seq, item.seq.num_computed_tokens + ahead, item.num_tokens
        end = start + n
        if ahead:
            b.ids += [0] * n
        elif item.draft:  # a verification: the last token, then the draft
            b.ids += (seq.token_ids[start:] + list(item.draft))[:n]
        else:
            b.ids += seq.token_ids[start:end]
        b.positions += range(start, end)
        b.pages += [seq.block_table[p // P] for p in range(start, end)]
        b.offsets += [p % P for p in range(start, end)]
        b.rope_lens += [end] * n
        b.query_lens.append(n)
        b.kv_lens.append(end)
        b.page_lists.append(seq.block_table[: -(-end // P)])
        b.block_tables.append(seq.block_table)
        b.stable_pages.append(-(-seq.num_computed_tokens // P))
        if item.samples:
            b.sample_idx.append(len(b.ids) - 1)
    return b
