"""What a verification's union of k + 1 queries' pages costs in host fetches on the real
model, against a one-token step: the default model decoding over a book with speculation
(a self-draft of fixed length k), the tiered cache with a GPU tier that keeps every page it
ever fetched. Then each step's fetches are exactly the pages no earlier query of that
layer had selected, and

    fetched per verification / fetched per one-token step

is how much more a verification fetches than the plain decode step, when the tier keeps
recently used pages (the H200 bench `spec_verify --recurring` draws a verification's later
queries' new pages at random instead). Steps are told apart by a wrapper on the runner's
verify.

python -m bench.verify_union [--book ../shared/data/books/moby_dick.txt] [--context 6900] \
    [--tokens 96] [--k 4] [--budget 0.05] [--json out.json]
"""

from __future__ import annotations

import argparse
import json


def run(engine, ids: list[int], tokens: int, warm: int = 4) -> dict:
    from engine import SamplingParams

    tiers, runner = engine.runner.tiers, engine.runner
    kinds = []
    verify = runner.verify

    def tagged(out):
        kinds.append(max(it.num_tokens for it in out.scheduled))
        return verify(out)

    runner.verify = tagged
    req = engine.add_request(ids, SamplingParams(max_tokens=tokens + warm, ignore_eos=True))
    while req.stats.completion_tokens < warm:
        engine.step()
    per = {"verify": [], "one": []}
    while not req.done:
        before, n = tiers.stats, len(kinds)
        engine.step()
        after = tiers.stats
        fetched = after.fetched - before.fetched
        selected = after.selected - before.selected
        if after.steps == before.steps:
            continue  # (a step without a decode forward: the prefill's tail, drafting)
        kind = "verify" if len(kinds) > n else "one"
        per[kind].append((fetched, selected, kinds[-1] if kind == "verify" else 1))
    runner.verify = verify
    out = {}
    for kind, rows in per.items():
        if rows:
            out[kind] = {"steps": len(rows), "fetched_per_step": sum(r[0] for r in rows) / len(rows),
                         "selected_per_step": sum(r[1] for r in rows) / len(rows),
                         "mean_queries": sum(r[2] for r in rows) / len(rows)}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--book", default="../shared/data/books/moby_dick.txt")
    ap.add_argument("--offset", type=int, default=200000, help="characters into the book")
    ap.add_argument("--context", type=int, default=6900)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--budget", type=float, default=0.05)
    ap.add_argument("--json")
    args = ap.parse_args()
    from engine import Engine
    from engine.config import EngineConfig
    from engine.kv import SparseConfig
    from engine.spec.decoder import SpecConfig

    with open(args.book, encoding="utf-8") as f:
        text = f.read()[args.offset : args.offset + 8 * args.context]
    rows = {}
    for name, spec in (("plain", None),
                       ("self", SpecConfig("self", max_k=args.k, start_k=args.k, adaptive=False))):  # fmt: skip
        engine = Engine.load(None, device="cpu", config=EngineConfig(
            sparse=SparseConfig(budget_fraction=args.budget), speculate=spec))  # fmt: skip
        ids = engine.tokenizer.encode(text)[: args.context]
        rows[name] = run(engine, ids, args.tokens)
        print(name, json.dumps(rows[name]), flush=True)
    one = rows["plain"]["one"]["fetched_per_step"]
    ver = rows["self"].get("verify")
    if ver:
        print(f"context {len(ids)}, budget {args.budget:.0%}, k = {args.k}: a verification of "
              f"{ver['mean_queries']:.2f} queries fetched {ver['fetched_per_step']:.1f} units per "
              f"step ({ver['selected_per_step']:.0f} selected), a one-token step "
              f"{one:.1f} ({rows['plain']['one']['selected_per_step']:.0f} selected): "
              f"{ver['fetched_per_step'] / max(one, 1e-9):.2f}x")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
