"""What a session's prompt leaves out to fit the model's window.

A session's prompt is its root (the system message and the first user message, which holds
the packed repository or book and the first question), then its turns. As the window fills,
the oldest turns' tool results are left out first, then the oldest turns themselves; the
root is always sent whole, and one short assistant message stands for the turns left out.
Only what is sent changes: the store keeps every message. The state (how many turns and
tool results are left out) is stored with each turn's usage, so the next turn starts from
it and its prompt keeps the same prefix (whose KV is reused) until the window fills again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

KEY = "compaction"  # the usage key it is stored under, and the history message key
LEFT_OUT_RESULT = "(result left out to fit the model's window)"
# the same words however many turns it stands for: the prefix up to the kept turns stays
# the same as more are left out, and its KV is reused
LEFT_OUT_TURNS = "(Earlier turns of this conversation are left out here to fit the model's window.)"


def root_size(messages: list[dict]) -> int:
    """The root's messages: the system message (where there is one) and the first user
    message."""
    return 2 if messages and messages[0].get("role") == "system" else 1


def turn_starts(messages: list[dict]) -> list[int]:
    """Where each turn after the root starts: turn 1 (the first answer, its tool steps)
    right after the root, then each later question (a user message that does not follow a
    tool result, as a tool step's note does)."""
    root = root_size(messages)
    starts = [root]
    for i in range(root, len(messages)):
        if messages[i].get("role") == "user" and messages[i - 1].get("role") != "tool":
            starts.append(i)
    return starts


def _sent(message: dict) -> dict:
    return {k: v for k, v in message.items() if k != KEY}


@dataclass(frozen=True, slots=True)
class Compaction:
    """`turns`: the earliest turns left out (turn 1 is the first answer and its tool steps,
    as the root holds the first question); `results`: the earliest tool results left out,
    counted in message order. The current turn (the last question on) is never left out."""

    turns: int = 0
    results: int = 0

    def __bool__(self) -> bool:
        return bool(self.turns or self.results)

    @classmethod
    def of(cls, data) -> Compaction:
        """From a stored usage's KEY; anything else (absent, malformed) is none."""
        if not isinstance(data, dict):
            return cls()
        turns, results = data.get("turns", 0), data.get("results", 0)
        ok = all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                 for n in (turns, results))  # fmt: skip
        return cls(turns, results) if ok else cls()

    @classmethod
    def stored(cls, history: list[dict]) -> Compaction:
        """The latest state a stored turn carries (agentctx.ask.history_messages)."""
        for m in reversed(history):
            if KEY in m:
                return cls.of(m[KEY])
        return cls()

    def data(self) -> dict:
        return {"turns": self.turns, "results": self.results}

    def union(self, other: Compaction) -> Compaction:
        return Compaction(max(self.turns, other.turns), max(self.results, other.results))

    def apply(self, messages: list[dict]) -> list[dict]:
        """The messages as sent: the root, a note for the turns left out, then the rest
        with the results left out replaced by a short note."""
        starts = turn_starts(messages)
        earlier = len(starts) - 1  # the last start is the current turn's
        turns = min(self.turns, earlier)
        root = root_size(messages)
        out = [_sent(m) for m in messages[:root]]
        begin = starts[turns] if turns else root
        if turns:
            out.append({"role": "assistant", "content": LEFT_OUT_TURNS})
        seen = sum(m.get("role") == "tool" for m in messages[root:begin])
        for m in messages[begin:]:
            m = _sent(m)
            if m.get("role") == "tool":
                seen += 1
                if seen <= self.results:
                    m["content"] = LEFT_OUT_RESULT
            out.append(m)
        return out

    def candidates(self, messages: list[dict]) -> list[Compaction]:
        """The states past this one, in the order they leave more out: each earlier turn's
        tool results, oldest first, then each earlier turn, oldest first."""
        starts = turn_starts(messages)
        results = sum(m.get("role") == "tool" for m in messages[: starts[-1]])
        more = [Compaction(self.turns, r) for r in range(self.results + 1, results + 1)]
        last = max(self.results, results)
        more += [Compaction(t, last) for t in range(self.turns + 1, len(starts))]
        return more

    def most(self, messages: list[dict], keep: int = 1) -> Compaction:
        """Every earlier turn's tool results and all but the last `keep` earlier turns left
        out (the TUI's /compact)."""
        starts = turn_starts(messages)
        results = sum(m.get("role") == "tool" for m in messages[: starts[-1]])
        turns = max(len(starts) - 1 - keep, 0)
        return self.union(Compaction(turns, results))

    def left_out_since(self, before: Compaction) -> str:
        """What this state leaves out that `before` did not, in words."""
        parts = []
        if self.turns > before.turns:
            n = self.turns - before.turns
            which = "oldest" if not before.turns else "next oldest"
            parts.append(f"the {which} {n} turns" if n > 1 else f"the {which} turn")
        if self.results > before.results:
            n = self.results - before.results
            parts.append(f"{n} tool result{'s' if n > 1 else ''}")
        return " and ".join(parts) or "nothing more"


def fit(
    messages: list[dict], size: Callable[[Compaction], int], limit: int, start: Compaction
) -> tuple[Compaction, int]:
    """(the state to send `messages` with, its prompt's tokens). `start` when its prompt
    takes at most `limit` tokens; else the first candidate whose prompt takes at most half
    way from the least prompt (everything earlier left out) to `limit`, so that the next
    turns append to the same prefix for a while; else, when not even the least prompt fits,
    the state that leaves everything out (the caller says the window is too small).
    `size(state)` gives the tokens of the prompt `state` sends (its chat template's)."""
    tokens = size(start)
    steps = start.candidates(messages)
    if tokens <= limit or not steps:
        return start, tokens
    floor = size(steps[-1])
    if floor > limit:
        return steps[-1], floor
    target = floor + (limit - floor) // 2
    lo, hi = 0, len(steps) - 1  # the prompt shrinks as more is left out
    while lo < hi:
        mid = (lo + hi) // 2
        if size(steps[mid]) <= target:
            hi = mid
        else:
            lo = mid + 1
    return steps[hi], size(steps[hi])


def compact_to_fit(
    messages: list[dict], count: Callable[[list[dict]], int], window: int, room: int,
    start: Compaction, output,
) -> tuple[Compaction, list[dict]]:  # fmt: skip
    """(the state, the messages as sent) for a prompt that must leave `room` tokens of the
    window for the answer: `start`, or more left out (fit). What more is left out is said
    on `output`: its `compacted` (the --json event) where it has one, else a line. `count`
    gives a prompt's tokens; each state's prompt is counted once."""
    sizes: dict[Compaction, int] = {}

    def size(state: Compaction) -> int:
        if state not in sizes:
            sizes[state] = count(state.apply(messages))
        return sizes[state]

    state, tokens = fit(messages, size, window - room, start)
    if state != start:
        before = size(start)
        line = (
            f"context: left out {state.left_out_since(start)} of this session to fit the "
            f"model's {window:,}-token window ({before:,} -> {tokens:,} prompt tokens); the "
            "session store keeps them, and the packed context is sent whole"
        )
        data = {"left_out": state.data(), "before": start.data(),
                "prompt_tokens_before": before, "prompt_tokens": tokens}  # fmt: skip
        compacted = getattr(output, "compacted", None)
        compacted(line, data) if compacted is not None else output.info(line)
    return state, state.apply(messages)
