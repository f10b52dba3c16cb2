"""Where a step's GPU time goes, from kernel traces (bench.spec_verify --trace DIR): per
trace, the GPU's busy time (the union of kernel intervals) and idle time per step, the
kernels by total time, and the idle time by the kernel that ends it (a gap before a kernel is
its launch latency in a graph, or a wait on another stream or on the host).

python -m bench.trace_gaps DIR/trace_b1_k0.json DIR/trace_b1_k4.json [--top 15]
"""

from __future__ import annotations

import argparse
import json


def summarize(path: str, top: int) -> dict:
    with open(path) as f:
        data = json.load(f)
    reps, kernels = data["reps"], data["kernels"]
    busy = idle = 0.0
    end = None
    by_name: dict[str, list[float]] = {}
    idle_before: dict[str, float] = {}
    for name, start, dur in kernels:
        by_name.setdefault(name, []).append(dur)
        if end is not None and start > end:
            gap = start - end
            # a gap of more than 1 ms: the host between two calls (not the step's own)
            if gap < 1000:
                idle += gap
                idle_before[name] = idle_before.get(name, 0.0) + gap
        stop = start + dur
        covered = max(0.0, (min(stop, end) - start) if end is not None else 0.0)
        busy += dur - covered
        end = stop if end is None else max(end, stop)
    print(f"{path}: {len(kernels) / reps:.0f} kernels per step, busy {busy / reps / 1000:.3f} ms,"
          f" idle {idle / reps / 1000:.3f} ms per step")  # fmt: skip
    print(f"  kernels by time per step (top {top}):")
    for name, ts in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"    {sum(ts) / reps:9.1f} us {len(ts) / reps:7.1f} x  {name[:70]}")
    print(f"  idle time before (top {top}):")
    for name, gap in sorted(idle_before.items(), key=lambda kv: -kv[1])[:top]:
        n = len(by_name[name]) / reps
        print(f"    {gap / reps:9.1f} us {n:7.1f} x  {name[:70]}")
    return {"busy_ms": busy / reps / 1000, "idle_ms": idle / reps / 1000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    for path in args.traces:
        summarize(path, args.top)


if __name__ == "__main__":
    main()
