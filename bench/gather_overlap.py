"""The UVA gather's shape on the H200: bandwidth against programs and units per round trip
(`rows`), alone and beside a decode layer's weight GEMVs on the main stream (what a
prefetch overlaps), against the cudaMemcpy ceiling of the same run.

Per "layer": one 8B decode layer's GEMVs at batch 1 (QKV 4096x6144, O 4096x4096, gate-up
4096x28672, down 14336x4096, bf16: ~436 MB of weights) on the main stream, and the
gather of one worst-case layer's missing pages (900 units of 8 KB: 7.4 MB) from pinned
host memory on a side stream; 32 layers per timed step, as a decode step would queue them.

python3 -m bench.gather_overlap [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

P, D = 16, 128  # 8 KB units (K and V of one page of one KV head, bf16)
LAYERS = 32


def event_ms(fn, iters: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def main() -> None:
    from kernels.uva_gather import gather_pages
    from kernels.views import GatherLaunch

    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=900, help="units gathered per layer")
    ap.add_argument("--programs", type=int, nargs="+", default=[4, 8, 16, 32, 66, 132])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = "cuda"
    g = torch.Generator().manual_seed(0)
    big = torch.empty(1 << 28, dtype=torch.uint8).pin_memory()
    dbig = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
    ceiling = (1 << 28) / event_ms(lambda: dbig.copy_(big, non_blocking=True)) / 1e6
    big = dbig = None
    n_host = (4 << 30) // (2 * P * D * 2)
    host = torch.empty(n_host, 2, P, D, dtype=torch.bfloat16).pin_memory()
    n = args.units
    slots = torch.empty(LAYERS * n, 2, P, D, dtype=torch.bfloat16, device=dev)
    src = [torch.randperm(n_host, generator=g)[:n].to(torch.int32).to(dev) for _ in range(LAYERS)]
    dst = [torch.arange(i * n, (i + 1) * n, dtype=torch.int32, device=dev) for i in range(LAYERS)]
    unit_bytes = 2 * P * D * 2
    step_mb = LAYERS * n * unit_bytes / 1e6

    h = 4096
    w = [torch.randn(o, i, dtype=torch.bfloat16, device=dev) * 0.01
         for i, o in ((h, 6144), (h, h), (h, 28672), (14336, h))]  # fmt: skip
    x = torch.randn(1, h, dtype=torch.bfloat16, device=dev)

    def layer_gemvs() -> None:
        y = torch.nn.functional.linear(x, w[0])[:, :h]
        y = torch.nn.functional.linear(y, w[1])
        gu = torch.nn.functional.linear(y, w[2])
        torch.nn.functional.linear(torch.nn.functional.silu(gu[:, :14336]) * gu[:, 14336:], w[3])

    def gemvs() -> None:
        for _ in range(LAYERS):
            layer_gemvs()

    t_main = event_ms(gemvs)
    side = torch.cuda.Stream()
    rows_out = [{"what": "cudaMemcpy pinned->device, 256 MiB", "GB/s": ceiling},
                {"what": "32 layers of 8B decode GEMVs (main stream alone)", "ms": t_main}]  # fmt: skip
    print(json.dumps(rows_out[0]), json.dumps(rows_out[1]), sep="\n", flush=True)
    for r in args.rows:
        for progs in args.programs:

            def gathers(r=r, progs=progs) -> None:
                for i in range(LAYERS):
                    gather_pages(host, slots, src[i], dst[i], GatherLaunch(progs, r))

            t_g = event_ms(gathers)

            def both(gathers=gathers) -> None:
                # each layer: the gather on the side stream beside that layer's GEMVs
                main = torch.cuda.current_stream()
                for i in range(LAYERS):
                    side.wait_stream(main)
                    with torch.cuda.stream(side):
                        gather_pages(host, slots, src[i], dst[i], GatherLaunch(progs, r))
                    layer_gemvs()
                    main.wait_stream(side)

            t_b = event_ms(both)
            row = {"rows": r, "programs": progs, "gather_ms": t_g,
                   "gather_GB/s": step_mb / t_g, "x_ceiling": step_mb / t_g / ceiling,
                   "both_ms": t_b, "main_alone_ms": t_main,
                   "hidden": max(0.0, min(1.0, (t_main + t_g - t_b) / t_g)),
                   "floor_ms": max(t_main, t_g)}  # fmt: skip
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    print(
        f"\n{LAYERS} layers x {n} units of {unit_bytes // 1024} KB ({step_mb:.0f} MB); "
        f"cudaMemcpy ceiling {ceiling:.1f} GB/s; GEMVs alone {t_main:.2f} ms"
    )
    print(" rows progs  gather ms   GB/s  x ceil   both ms  hidden  both/max(alone)")
    for row in rows_out[2:]:
        print(f"{row['rows']:>5} {row['programs']:>5} {row['gather_ms']:10.2f} "
              f"{row['gather_GB/s']:6.1f} {row['x_ceiling']:6.2f}x {row['both_ms']:9.2f} "
              f"{row['hidden']:6.0%}  {row['both_ms'] / row['floor_ms']:6.2f}x")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
