"""Where a step's GPU time goes, from kernel traces (bench.spec_verify --trace DIR): per
trace, the GPU's busy time (the union of kernel intervals) and idle time per step, the
kernels by total time, and the idle time by the kernel that ends it (a gap before a kernel is
its launch latency in a graph, or a wait on another stream or on the host).

python -m bench.trace_gaps DIR/trace_b1_k0.json DIR/trace_b1_k4.json [--top 15]
    [--around NAME]

--around NAME: each kernel of the first step whose name holds NAME, with the kernels just
before and after it and the gaps between (where in the step it runs).
"""

from __future__ import annotations

import argparse
import json


def around(kernels: list, per_step: int, name: str) -> None:
    """The first step's kernels named like `name`, each between its neighbours."""
    first = kernels[:per_step]
    for i, (kname, start, dur) in enumerate(first):
        if name not in kname:
            continue
        before = first[i - 1] if i else None
        after = first[i + 1] if i + 1 < len(first) else None
        gap_in = start - (before[1] + before[2]) if before else 0.0
        gap_out = after[1] - (start + dur) if after else 0.0
        print(
            f"    #{i:5d} {before[0][:40] if before else '-':>40} | {gap_in:7.1f} us | "
            f"{kname[:28]} {dur:6.1f} us | {gap_out:7.1f} us | {after[0][:40] if after else '-'}"
        )


def summarize(path: str, top: int, where: str | None = None) -> dict:
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
    gaps = sorted(
        max(0.0, b[1] - (a[1] + a[2])) for a, b in zip(kernels[:-1], kernels[1:], strict=True)
    )
    gaps = [g for g in gaps if g < 1000]
    if gaps:
        print(f"  gaps between kernels: median {gaps[len(gaps) // 2]:.2f} us, "
              f"90th percentile {gaps[int(len(gaps) * 0.9)]:.2f} us")  # fmt: skip
    if where:
        print(f"  around {where!r} (the first step):")
        around(kernels, len(kernels) // reps, where)
    return {"busy_ms": busy / reps / 1000, "idle_ms": idle / reps / 1000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--around", metavar="NAME", help="where the kernels named like NAME run")
    args = ap.parse_args()
    for path in args.traces:
        summarize(path, args.top, args.around)


if __name__ == "__main__":
    main()
