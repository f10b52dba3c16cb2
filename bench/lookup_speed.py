"""Prompt lookup's proposal time against the context's length: the engine's vectorised search
(engine.spec.lookup, over a sequence's int32 history) and a plain Python scan (what it
replaced; the same proposals), in one run, on random token ids with a 49,152-token
vocabulary. Two cases: the last tokens occur nowhere earlier (the whole history is
searched), and they occur once near the start (a continuation is found).

python -m bench.lookup_speed [--lengths 8192 131072 500000] [--reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import time


def best_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 131072, 500000])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    from engine.spec.lookup import PromptLookup, TokenHistory
    from engine.spec.lookup import propose_by_scan as plain_scan

    rng = random.Random(0)
    lookup = PromptLookup()
    rows = []
    for n in args.lengths:
        base = [rng.randrange(49152) for _ in range(n)]
        cases = {
            "no match": base + [49152, 49153, 49154, 49155],  # ids the history never holds
            "match": base + base[100:104],  # the last 4 tokens occurred at 100
        }
        for case, tokens in cases.items():
            history = TokenHistory()
            history.sync(tokens[:-1])  # held already, as a decoding sequence's is
            want = plain_scan(tokens, 4)

            def vectorised(tokens=tokens, history=history):
                return lookup.propose(history.sync(tokens), 4)

            assert vectorised() == want, (n, case)
            row = {
                "tokens": len(tokens), "case": case,
                "vectorised_ms": best_ms(vectorised, args.reps),
                "plain_scan_ms": best_ms(lambda t=tokens: plain_scan(t, 4), max(1, args.reps // 2)),
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'tokens':>8} {'case':>9} {'vectorised ms':>14} {'plain scan ms':>14} {'ratio':>7}")
    for r in rows:
        print(f"{r['tokens']:>8} {r['case']:>9} {r['vectorised_ms']:14.3f} "
              f"{r['plain_scan_ms']:14.2f} {r['plain_scan_ms'] / r['vectorised_ms']:6.0f}x")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
