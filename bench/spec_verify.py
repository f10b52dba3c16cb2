"""The cost of verifying k drafted tokens against a single-token decode step, over the tiered
sparse KV cache (dummy 8B weights, 2% budget, realistic page locality, one process under a
24 GiB GPU cap as in bench.e2e_sparse), at batch 1 and 8 (the 8 sequences share one long
context through the prefix cache: eight questions over one repository or book).

For k = 0 (one token), 1, 2, 4, 8: `ModelRunner.verify` over every sequence's last token and
a random k-token draft, with the k+1 queries' pages fetched once as a union (the engine's
way) and fetched query by query. Each verification's own selections are what single-token
steps at those positions would pick; with synthetic selections, later queries keep 85% of
the first one's pages (the step-to-step locality measured on the real model).

Two times per case: wall time of the eager step (verification is not captured in a CUDA
graph: Python launches ~6,000 kernels per step, so wall time is launch-bound), and the GPU
kernel time per step (sum of kernel durations from torch.profiler), the device cost that a
graph replay approaches. The single-token step in a CUDA graph is the reference.

`--graphs`: the verifications run in CUDA graphs (engine.runtime.verify_graphs: per batch size,
k+1 and page budget; each union in a fixed width), so wall time is the measure; only the
shared fetch then.

`--chunks 1 4`: with --graphs, each verification captured as that many graphs, one run per
value (engine.runtime.verify_graphs.VERIFY_CHUNKS). `--trace DIR`: each row's kernels in GPU order
(and the decode graph step's), for `python -m bench.trace_gaps`.

python3 -m bench.spec_verify --context 131072 [--batches 1 8] [--graphs [--chunks 1 4]]
    [--trace DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from bench.e2e_sparse import model_config, prompts_for, sync


def kernel_ms(fn, reps: int, top: int = 0) -> float:
    """The summed kernel time per call of fn (ms); `top`: also print the `top` kernels by
    time per call (us and launches per call)."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        sync()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    us = [getattr(e, "device_time", None) or e.cuda_time for e in kernels]
    if top:
        by_name: dict[str, list[float]] = {}
        for e, t in zip(kernels, us, strict=True):
            by_name.setdefault(e.name[:70], []).append(t)
        ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
        print(f"    {len(kernels) / reps:.0f} kernels per call; top {top}:")
        for name, ts in ranked[:top]:
            print(f"    {sum(ts) / reps:9.1f} us {len(ts) / reps:6.1f} x  {name}")
    return sum(us) / 1000 / reps


def kernel_trace(fn, reps: int, path: str) -> None:
    """The kernels of `reps` calls of fn, in GPU order, to `path` (JSON rows: name, start us,
    duration us): where a step's GPU time goes between kernels (bench/trace_gaps.py)."""
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        sync()
    fd, raw = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    prof.export_chrome_trace(raw)
    with open(raw) as f:
        events = json.load(f)["traceEvents"]
    os.unlink(raw)
    rows = sorted((e["name"][:80], float(e["ts"]), float(e["dur"])) for e in events
                  if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))  # fmt: skip
    rows.sort(key=lambda r: r[1])
    with open(path, "w") as f:
        json.dump({"reps": reps, "kernels": rows}, f)


def wall_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    ap.add_argument("--preset", default="llama-3.1-8b")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--budget", type=float, default=0.02)
    ap.add_argument("--gpu-budget", default="24GiB")
    ap.add_argument("--gpu-kv-budget", default="5GiB")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--graphs",
        action="store_true",
        help="verification in CUDA graphs (engine.runtime.verify_graphs)",
    )
    ap.add_argument("--chunks", type=int, nargs="+", default=[4],
                    help="with --graphs: each verification in this many graphs (one run per "
                    "value; engine.runtime.verify_graphs.VERIFY_CHUNKS)")  # fmt: skip
    ap.add_argument("--recurring", type=float, default=0.0,
                    help="share of the pages a selection does not keep that come from pages "
                    "read before (0.86 measured on the default model, docs/quality.md; 0: all "
                    "at random)")  # fmt: skip
    ap.add_argument("--prefetch", default="off", choices=["off", "forecast", "oracle"])
    ap.add_argument("--skip-prefill-attention", action="store_true",
                    help="build the context without prefill attention (dummy weights: decode "
                    "timing is unchanged; a 500K prefill takes seconds, not minutes)")  # fmt: skip
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="print each row's N most costly kernels (per verification)")  # fmt: skip
    ap.add_argument("--trace", metavar="DIR",
                    help="write each row's kernels in GPU order (and the decode graph's) to "
                    "DIR/trace_b{batch}_k{k}_c{chunks}.json")  # fmt: skip
    ap.add_argument("--select-method", choices=["probe2", "hist", "split", "torch"],
                    help="every top-k selection by this method (default: the engine's pick "
                    "per shape, timed at its first call)")  # fmt: skip
    ap.add_argument("--json")
    args = ap.parse_args()
    from agentctx.kv_snapshots import parse_size
    from bench.scorers import (
        MEASURED_FORECAST_RECALL,
        MEASURED_LOCALITY,
        SyntheticScorer,
        skip_prefill_attention,
        use_scorer,
    )
    from engine import Engine, SamplingParams
    from engine.config import EngineConfig
    from engine.kv import SparseConfig
    from engine.runtime import verify_graphs
    from engine.runtime.scheduler import ScheduledSeq, SchedulerOutput

    n, bmax = args.context, max(args.batches)
    window = n + 256
    # --prefetch: the Forecast prefetch on both the one-token steps and the verifications
    # (simulated on the synthetic selections: query 0's pages, each predicted with the
    # training-free Forecast's measured recall, or all of them for the oracle)
    sparse = SparseConfig(budget_fraction=args.budget, gpu_kv_budget=parse_size(args.gpu_kv_budget),
                          forecast="off" if args.prefetch == "off" else "free")  # fmt: skip
    cfg = EngineConfig(max_model_len=window, max_num_seqs=bmax, sparse=sparse,
                       num_pages=-(-window // 16) + 32 * bmax + 64, max_num_batched_tokens=8192)  # fmt: skip
    if args.device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(parse_size(args.gpu_budget) / total)
    engine = Engine.load(f"dummy:{model_config(args)}", device=args.device, config=cfg)
    if args.skip_prefill_attention:
        skip_prefill_attention(engine)
    use_scorer(engine, SyntheticScorer(engine.runner.tiers, keep=MEASURED_LOCALITY, recurring=args.recurring,
                                       recall=1.0 if args.prefetch == "oracle" else MEASURED_FORECAST_RECALL))  # fmt: skip
    prompt = prompts_for(n, 1, engine.model_config.vocab_size)[0]
    runner, tiers, bm = engine.runner, engine.runner.tiers, engine.block_manager
    tiers.select_methods.only = args.select_method  # (None: the engine's pick per shape)
    decode_graphs, vgraphs = runner.decode_graphs, runner.verify_graphs
    if vgraphs is not None:
        vgraphs.enabled = args.graphs
    rng = random.Random(0)
    rows = []
    for batch in args.batches:
        params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
        reqs = [engine.add_request(prompt, params) for _ in range(batch)]
        while not all(r.stats.completion_tokens >= 4 for r in reqs):  # prefill, graph capture
            engine.step()
        sync()
        t0 = time.perf_counter()
        steps, spans = 8, []
        for _ in range(steps):
            engine.step()
            spans.append(decode_graphs.last_step_gpu_ms if decode_graphs else 0.0)
        sync()
        graph_ms = (time.perf_counter() - t0) * 1000 / steps
        # the decode graph's GPU span per step (events around its replay), median
        graph_span = sorted(spans)[len(spans) // 2] if decode_graphs else None
        if args.trace:
            kernel_trace(engine.step, 2, f"{args.trace}/trace_b{batch}_decode.json")
        seqs = [r.seq for r in reqs]
        vocab = engine.model_config.vocab_size
        modes = [(True, c) for c in args.chunks] if args.graphs else [(True, 1), (False, 1)]
        for shared, chunks in modes:
            tiers.sparse.verify_shared_fetch = shared
            if args.graphs and vgraphs is not None:  # (captured again in `chunks` graphs)
                verify_graphs.VERIFY_CHUNKS = chunks
                vgraphs.reset()
            for k in args.ks:
                for s in seqs:
                    assert bm.ensure_capacity(s, len(s) + k)
                drafts = [tuple(rng.randrange(100, vocab) for _ in range(k)) for _ in seqs]
                out = SchedulerOutput([ScheduledSeq(s, k + 1, True, draft=d)
                                       for s, d in zip(seqs, drafts, strict=True)], [])  # fmt: skip

                vspans, launches = [], []

                def step(out=out, vspans=vspans, launches=launches):
                    tiers.end_step(max(len(s) + (k + 1) - 1 for s in seqs))
                    replays = vgraphs.replays if vgraphs else 0
                    runner.verify(out)
                    if vgraphs and vgraphs.replays > replays:  # (a graph ran: its GPU span)
                        vspans.append(vgraphs.last_gpu_ms)
                        launches.append(vgraphs.last_launch_ms)

                step()
                step()  # warm-up: compile
                st0 = tiers.stats
                vspans.clear()
                launches.clear()
                wall = wall_ms(step, args.reps)
                span = sorted(vspans)[len(vspans) // 2] if vspans else None
                launch = sorted(launches)[len(launches) // 2] if launches else None
                if args.profile:
                    print(f"  batch {batch}, k = {k}:")
                on_gpu = args.device == "cuda"
                gpu = kernel_ms(step, 3, args.profile) if on_gpu else wall_ms(step, 3)
                st1 = tiers.stats
                if args.trace and on_gpu:
                    kernel_trace(step, 2, f"{args.trace}/trace_b{batch}_k{k}_c{chunks}.json")
                fetched = (st1.fetched - st0.fetched) / (args.reps + 3)
                row = {"context": n, "batch": batch, "k": k, "shared_fetch": shared,
                       "graph_chunks": chunks if args.graphs else None,
                       # host time of the verification graphs' replay calls, median
                       "verify_launch_ms": launch,
                       "prefetch": args.prefetch,
                       "graphs": bool(vgraphs and vgraphs.enabled),
                       "graph_replays": vgraphs.replays if vgraphs else 0,
                       "graph_fallbacks": vgraphs.fallbacks if vgraphs else 0,
                       "wall_ms": wall, "gpu_kernel_ms": gpu, "graph_decode_ms": graph_ms,
                       # GPU spans (events: kernels and the gaps between them), median
                       "verify_span_ms": span, "decode_graph_span_ms": graph_span,
                       "fetched_pages_per_step": fetched,
                       "fetched_mb_per_step": fetched * tiers.unit_bytes / 1e6}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
        for r in reqs:
            r.cancelled.set()
        engine.step()
    base = {(r["batch"], r["shared_fetch"], r["graph_chunks"]): r for r in rows if r["k"] == 0}
    print(f"\ncontext {n}, budget {args.budget:.1%}, prefetch {args.prefetch}; ratios against "
          "one token (k = 0)")  # fmt: skip
    print(f"{'batch':>5} {'k':>2} {'fetch':>9} {'graphs':>6} {'launch':>6} {'wall ms':>8} {'x':>5} {'GPU ms':>7} {'x':>5} "
          f"{'MB fetched':>10}  graph step ms  span ms  x decode span")  # fmt: skip
    for r in rows:
        b = base[(r["batch"], r["shared_fetch"], r["graph_chunks"])]
        launch = f"{r['verify_launch_ms']:6.2f}" if r["verify_launch_ms"] else f"{'-':>6}"
        print(f"{r['batch']:>5} {r['k']:>2} {'union' if r['shared_fetch'] else 'per-query':>9} "
              f"{r['graph_chunks'] or '-':>6} {launch} {r['wall_ms']:8.2f} {r['wall_ms'] / b['wall_ms']:5.2f} {r['gpu_kernel_ms']:7.2f} "
              f"{r['gpu_kernel_ms'] / b['gpu_kernel_ms']:5.2f} {r['fetched_mb_per_step']:10.1f}"
              f"  {r['graph_decode_ms']:13.2f}", end="")  # fmt: skip
        span, dspan = r["verify_span_ms"], r["decode_graph_span_ms"]
        print(f"  {span:7.2f}  {span / dspan:13.2f}" if span and dspan else "")
    # the select method per shape (rows, pages, budget, width) and what each took (ms, 5 calls)
    times_of = tiers.select_methods.method_times()
    for key, m in tiers.select_methods.chosen_methods().items():
        times = times_of.get(key, {})
        took = " ".join(f"{name} {t:.3f}" for name, t in sorted(times.items(), key=lambda x: x[1]))
        print(f"select {key}: {m} ({took})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
