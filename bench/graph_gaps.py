"""What a CUDA graph's kernel boundaries cost, by what else the graph holds: a chain of N
small kernels captured alone, with a device-to-device copy (a memcpy node) every E
kernels, and with a host-to-device copy from pinned memory every E kernels. A decode graph
step (no memcpy nodes) ran with ~0.1 us between kernels and a verification graph (35 memcpy
nodes) with ~0.5 us (H200 traces): this separates the node kinds from the rest.

python3 -m bench.graph_gaps [--kernels 2800] [--every 80]
"""

from __future__ import annotations

import argparse

import torch


def chain(n: int, every: int, kind: str, x, a, b, host):
    for i in range(n):
        x.add_(1.0)
        if kind != "kernels" and i % every == every - 1:
            if kind == "dtod":
                a.copy_(b)
            elif kind == "htod":
                a.copy_(host, non_blocking=True)
            elif kind == "copy-kernel":  # the same copy as a kernel (not a memcpy node)
                torch.add(b, 0, out=a)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=2800)
    ap.add_argument("--every", type=int, default=80)
    args = ap.parse_args()
    dev = "cuda"
    x = torch.zeros(256, device=dev)
    a, b = torch.zeros(4096, device=dev), torch.ones(4096, device=dev)
    host = torch.ones(4096).pin_memory()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    print(f"{'graph':>12} {'nodes':>6} {'ms per replay':>14} {'us per kernel':>14}")
    for kind in ("kernels", "dtod", "copy-kernel", "htod"):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            chain(8, args.every, kind, x, a, b, host)  # warm-up
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            chain(args.kernels, args.every, kind, x, a, b, host)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        ms = sorted(times)[len(times) // 2]
        extra = 0 if kind == "kernels" else args.kernels // args.every
        print(f"{kind:>12} {args.kernels + extra:>6} {ms:14.3f} "
              f"{1000 * ms / (args.kernels + extra):14.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
