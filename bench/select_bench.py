"""Top-k page selection on the GPU: the radix-histogram kernel, the bisection kernel and
torch.topk + sort, on score rows like the engine's (8 KV heads x batch, 32K / 128K / 500K
tokens in 16-token pages, 2% and 0.2% budgets), for two score spreads: standard normal
(spread exponents) and uniform in [0, 2) (one magnitude: the synthetic selections of the
benchmarks, and Quest bounds of one layer are alike). All three give the same pages.

python3 -m bench.select_bench [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    import triton.testing

    from kernels.page_score import select_pages

    rows = []
    for context in (32768, 131072, 500000):
        M = context // 16
        for batch in (1, 8):
            for frac in (0.02, 0.002):
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
                    for m in ("radix", "bisect", "torch"):
                        if m == "bisect" and M > 16384:
                            continue
                        try:
                            out = select_pages(s, lens, 16, budget, width=budget, method=m)
                        except Exception as e:  # noqa: BLE001
                            row[f"{m}_error"] = str(e).splitlines()[0][:200]
                            continue
                        same = torch.equal(out[1], ref[1]) and (
                            m == "torch" or torch.equal(out[0], ref[0])
                        )
                        row[f"{m}_ms"] = triton.testing.do_bench(
                            lambda m=m: select_pages(s, lens, 16, budget, width=budget, method=m)
                        )
                        row[f"{m}_same"] = same
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(f"\n{'context':>8} {'batch':>5} {'budget':>6} {'scores':>8} {'radix':>8} {'bisect':>8} "
          f"{'torch':>8}  (ms)")  # fmt: skip
    for r in rows:
        b = f"{r['bisect_ms']:8.3f}" if "bisect_ms" in r else f"{'-':>8}"
        print(f"{r['context']:>8} {r['batch']:>5} {r['budget']:>6.1%} {r['spread']:>8} "
              f"{r['radix_ms']:8.3f} {b} {r['torch_ms']:8.3f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
