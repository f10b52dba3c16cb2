"""Top-k page selection on the GPU (kernels.page_topk): the probe kernel (2 bits per round,
int32 keys), the histogram kernel (a byte per round), the split select (each row over
programs of 1,024 pages), and torch.topk + sort, on
score rows like the engine's (8 KV heads x batch, 32K / 128K / 500K
tokens in 16-token pages, 2% and 0.2% budgets), for two score spreads: standard normal
(spread exponents) and uniform in [0, 2) (one magnitude: the synthetic selections of the
benchmarks, and Quest bounds of one layer are alike). All give the same pages.

python3 -m bench.select_bench [--contexts 32768 131072 500000] [--budgets 0.02 0.002]
    [--methods probe2 hist split torch] [--eager] [--json out.json]

Times are of CUDA-graph replays (10 calls per graph), as decode steps run the selection;
--eager times eager calls. --cold: each call follows a write of 256 MiB (the L2 cache and
the kernels' code evicted, as a decode step's weight reads leave them), whose own time (a
graph of the writes alone) is subtracted.
"""

from __future__ import annotations

import argparse
import json

import torch

from kernels.page_topk import MAX_PAGES, METHODS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072, 500000])
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.02, 0.002])
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--eager", action="store_true",
                    help="time eager calls (Python's launch rate included), not CUDA-graph "
                    "replays as decode steps run them")  # fmt: skip
    ap.add_argument(
        "--cold",
        action="store_true",
        help="each call after a 256 MiB write (caches cold), its time subtracted",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    import triton.testing

    from engine.kv.select_methods import graph_of
    from kernels.page_topk import select_pages as select_by_rule
    from kernels.views import SelectRule

    def select_pages(s, lens, page_size, budget, width, method):
        return select_by_rule(s, lens, SelectRule(page_size, budget, width=width), method=method)

    flush = torch.empty(64 << 20, dtype=torch.float32, device="cuda") if args.cold else None
    flush_ms = 0.0
    if args.cold:
        g = graph_of(lambda: flush.fill_(1.0), reps=10)
        flush_ms = triton.testing.do_bench(g.replay) / 10
    rows = []
    for context in args.contexts:
        M = context // 16
        # (5 and 40 rows of 8 heads: a batch-1 and a batch-8 verification of k = 4, each
        # query its own row; 131,328 tokens: 8,208 pages, a row that is not a power of two,
        # as a 128K context plus its decode room gives)
        for batch in (1, 5, 8, 40) if 131072 <= context < 500000 else (1, 8):
            for frac in args.budgets:
                budget = max(4, round(frac * M))
                for spread in ("normal", "uniform"):
                    g = torch.Generator(device="cuda").manual_seed(0)
                    shape = (batch, 8, M)
                    if spread == "normal":
                        s = torch.randn(shape, device="cuda", generator=g)
                    else:
                        s = 2 * torch.rand(shape, device="cuda", generator=g)
                    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
                    row = {"context": context, "batch": batch, "budget": frac, "spread": spread}
                    ref = select_pages(s, lens, 16, budget, width=budget, method="torch")
                    for m in args.methods:
                        if MAX_PAGES.get(m, M) < M:
                            continue
                        try:
                            out = select_pages(s, lens, 16, budget, width=budget, method=m)
                        except Exception as e:  # noqa: BLE001
                            row[f"{m}_error"] = str(e).splitlines()[0][:200]
                            continue
                        same = torch.equal(out[1], ref[1]) and (
                            m == "torch" or torch.equal(out[0], ref[0])
                        )

                        def call(m=m):
                            if flush is not None:
                                flush.fill_(1.0)
                            return select_pages(s, lens, 16, budget, width=budget, method=m)

                        graph = None if args.eager else graph_of(call, reps=10)
                        if graph is None:
                            row[f"{m}_ms"] = triton.testing.do_bench(call) - flush_ms
                        else:
                            row[f"{m}_ms"] = triton.testing.do_bench(graph.replay) / 10 - flush_ms
                        row[f"{m}_timed"] = "eager" if graph is None else "graph"
                        row[f"{m}_same"] = same
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.cold:
        print(f"\ncold: each call after a 256 MiB write ({flush_ms:.3f} ms, subtracted)")
    print(
        f"\n{'context':>8} {'batch':>5} {'budget':>6} {'scores':>8} "
        + " ".join(f"{m:>8}" for m in METHODS)
        + "  (ms)"
    )
    for r in rows:
        ms = " ".join(f"{r[m + '_ms']:8.3f}" if m + "_ms" in r else f"{'-':>8}" for m in METHODS)
        bad = [m for m in METHODS if r.get(m + "_same") is False]
        print(
            f"{r['context']:>8} {r['batch']:>5} {r['budget']:>6.1%} {r['spread']:>8} {ms}"
            + (f"  DIFFERENT: {bad}" if bad else "")
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
