"""How often a page that a layer selects anew (not selected at the step before) was selected
at an earlier step: the real default model decoding over a book, with the tiered cache and
a GPU tier large enough to keep every page it ever fetched. Then the tier's fetches after
the first steps are exactly the pages never selected before, and

    recurring = 1 - fetched / (selections not selected at the step before)

is the share of "new" pages that a tier keeping recently used pages already holds. (The GPU
benchmarks' synthetic "realistic" variant draws its new pages at random, i.e. assumes none
recur.)

python -m bench.page_recurrence [--book ../shared/data/books/moby_dick.txt] [--context 6900] \
    [--tokens 128] [--budgets 0.02 0.05] [--json out.json]
"""

from __future__ import annotations

import argparse
import json


def measure(engine, ids: list[int], tokens: int, warm: int = 2):
    """Decode `tokens` tokens after `ids` and `warm` first steps (they fill the empty tier);
    returns the tier's counters over those tokens and the recurring share."""
    from engine import SamplingParams

    req = engine.add_request(ids, SamplingParams(max_tokens=tokens + warm, ignore_eos=True))
    while req.stats.completion_tokens < warm:
        engine.step()
    tiers = engine.runner.tiers
    tiers.reset_stats()
    while not req.done:
        engine.step()
    st = tiers.stats
    return st, 1 - st.fetched / max(1, st.locality_total - st.locality_hits)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--book", default="../shared/data/books/moby_dick.txt")
    ap.add_argument("--offset", type=int, default=200000, help="characters into the book")
    ap.add_argument("--context", type=int, default=6900)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.02, 0.05])
    ap.add_argument("--json")
    args = ap.parse_args()
    from engine import Engine
    from engine.config import EngineConfig
    from engine.kv import SparseConfig

    with open(args.book, encoding="utf-8") as f:
        text = f.read()[args.offset : args.offset + 8 * args.context]
    rows = []
    for frac in args.budgets:
        engine = Engine.load(None, device="cpu",
                             config=EngineConfig(sparse=SparseConfig(budget_fraction=frac)))  # fmt: skip
        ids = engine.tokenizer.encode(text)[: args.context]
        st, recurring = measure(engine, ids, args.tokens)
        row = {"budget": frac, "context": len(ids), "steps": args.tokens,
               "selections": st.selected, "locality": st.locality,
               "new_vs_last_step": st.locality_total - st.locality_hits,
               "never_selected_before": st.fetched, "recurring": recurring,
               "fetched_per_selection": st.fetch_fraction}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'budget':>6} {'locality':>8} {'new/step':>9} {'recurring':>9} {'fetched':>8}")
    for r in rows:
        print(f"{r['budget']:>6.0%} {r['locality']:>8.1%} {1 - r['locality']:>9.1%} "
              f"{r['recurring']:>9.1%} {r['fetched_per_selection']:>8.1%}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
