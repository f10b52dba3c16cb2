"""Where a sparse decode step's time goes (dummy 8B weights, tiered cache, one process under
the 24 GiB cap as in bench.e2e_sparse): the step time in CUDA graphs and eagerly, then
torch.profiler over a few eager decode steps and over a few graph replays (the prefill is
kept out of the profile), ops and kernels ranked by GPU time, with the number of kernels
per step.

python3 -m bench.profile_decode --context 131072 --variant realistic --prefetch off forecast \
    [--json out.json]
python3 -m bench.profile_decode --dense --context 4096     # the dense path: KV all on the GPU

Kernels are grouped by kind in the JSON's `kinds` (GEMMs, attention, selection, ...), each
with its GPU ms per step, so the question "where does a step's time go" reads off one table.
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.e2e_sparse import add_bytes_options, model_config, prompts_for, sync, timed_decode
from bench.scorers import MEASURED_FORECAST_RECALL, MEASURED_LOCALITY


def profile(engine, prompts, steps: int, trace: str | None = None) -> tuple:
    """Profile `steps` decode steps, after the prompts' prefill and first step (outside the
    profile: the re-submitted prompt's last page is prefilled again, and its context gather
    would swamp a decode step's kernels); returns (table, kernels per step, GPU ms per step)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_ctx

    from engine import SamplingParams

    params = SamplingParams(max_tokens=steps + 2, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in prompts]
    while not all(r.stats.completion_tokens for r in reqs):
        engine.step()
    engine.step()  # one plain decode step outside the profile
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with prof_ctx(activities=acts) as prof:
        for _ in range(steps):
            engine.step()
        sync()
    while not all(r.done for r in reqs):
        engine.step()
    events = prof.key_averages()
    key = "self_device_time_total"
    try:
        table = events.table(sort_by=key, row_limit=40, max_name_column_width=60)
    except (AttributeError, KeyError):
        key = "self_cuda_time_total"
        table = events.table(sort_by=key, row_limit=40, max_name_column_width=60)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.device_time if hasattr(e, "device_time") else e.cuda_time for e in kernels)
    if trace:
        prof.export_chrome_trace(trace)
    try:
        tl = timeline(prof, steps)
    except Exception as e:  # (a profiler API that differs on this torch: report, go on)
        tl = {"error": repr(e)}
    return table, len(kernels) // steps, gpu_us / 1000 / steps, tl


def _ours(*names: str) -> str:
    """A pattern matching our Triton kernels by their exact names."""
    return r"^(?:" + "|".join(names) + r")$"


# kernel kinds by name: ours (kernels/*.py) by their Triton function names, cuBLAS's by its
# kernel families; the first pattern that matches wins
KINDS = (
    ("weights: GEMV (cuBLAS, W4A16)", _ours("_w4a16_kernel", "_w4a16_words_kernel") + r"|gemm|gemv|cutlass|xmma|nvjet"),
    ("weights: split-K reductions (cuBLAS, W4A16)", _ours("_sum_splits_kernel") + r"|splitkreduce"),
    ("attention and its split combine", _ours("_paged_decode_kernel", "_combine_kernel",
                                              "_sparse_decode_kernel", "_sparse_combine_kernel")),
    ("page scoring, selection and slot allocation", _ours(
        "_page_score_kernel", "_select_probe_kernel", "_select_hist_kernel",
        "_split_hist_kernel", "_split_count_kernel", "_split_write_kernel",
        "_union_mark_kernel", "_union_compact_kernel", "_recall_kernel", "_units_kernel",
        "_value_kernel", "_resolve_kernel", "_owner_kernel", "_victims_hist_kernel",
        "_victims_count_kernel", "_victims_write_kernel", "_assign_kernel", "_finish_kernel",
        "_clock_kernel")),
    ("host fetch (UVA gather)", _ours("_gather_kernel", "_stage_kernel")),
    ("norms, rope, KV append, activation", _ours(
        "_rmsnorm_kernel", "_rope_kv_kernel", "_silu_mul_kernel", "_append_kernel",
        "_tier_append_kernel")),
    ("copies and fills", r"memcpy|memset|copy_|fill"),
    ("torch's own kernels (index and mask glue, reductions)", r"at::native|void at::"),
    ("other", r""),
)  # fmt: skip


def kinds(events, steps: int) -> dict:
    """GPU ms and kernels per step of each kind (KINDS), from (name, duration ns) pairs."""
    import re

    out = {name: {"ms": 0.0, "kernels": 0} for name, _ in KINDS}
    for name, ns in events:
        kind = next(k for k, pattern in KINDS if re.search(pattern, name, re.IGNORECASE))
        out[kind]["ms"] += ns / 1e6 / steps
        out[kind]["kernels"] += 1
    return {
        k: {"ms": v["ms"], "kernels": round(v["kernels"] / steps, 1)}
        for k, v in out.items() if v["kernels"]
    }  # fmt: skip


def _union_ns(spans: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


def timeline(prof, steps: int) -> dict:
    """Streams and overlap from the profile's kernel records: per stream its busy time, the
    time two or more streams ran at once, and the time the busiest (main) stream sat idle
    while another one ran (waiting for it, or free to run), per step in ms; and the mean
    duration of the main stream's most frequent kernels (slower ones beside a prefetch mean
    the two compete for the GPU)."""
    try:
        evs = [e for e in prof.profiler.kineto_results.events()
               if e.device_type() == torch.autograd.DeviceType.CUDA and e.duration_ns() > 0]  # fmt: skip
    except AttributeError:
        return {}
    kern = [e for e in evs if "memcpy" not in e.name().lower() and "memset" not in e.name().lower()]
    if not kern:
        return {}
    by_stream: dict[int, list] = {}
    for e in kern:
        by_stream.setdefault(e.device_resource_id(), []).append(e)
    spans = {s: [(e.start_ns(), e.end_ns()) for e in es] for s, es in by_stream.items()}
    busy = {s: _union_ns(sp) for s, sp in spans.items()}
    main = max(busy, key=busy.get)
    every = [x for sp in spans.values() for x in sp]
    union = _union_ns(every)
    span = max(b for _, b in every) - min(a for a, _ in every)
    others = [x for s, sp in spans.items() if s != main for x in sp]
    # main idle while others ran = union - main busy
    ms = 1e-6 / steps

    def top(events) -> dict:
        names: dict[str, list] = {}
        for e in events:
            names.setdefault(e.name()[:50], []).append(e.duration_ns())
        common = sorted(names.items(), key=lambda kv: -sum(kv[1]))[:48]
        return {k: {"n": len(v) // steps, "mean_us": sum(v) / len(v) / 1000} for k, v in common}

    return {
        "kinds": kinds([(e.name(), e.duration_ns()) for e in evs], steps),
        "span_ms": span * ms, "gpu_busy_ms": union * ms, "main_busy_ms": busy[main] * ms,
        "side_busy_ms": _union_ns(others) * ms if others else 0.0,
        "overlap_ms": (sum(busy.values()) - union) * ms,
        "main_idle_while_side_ms": (union - busy[main]) * ms, "streams": len(busy),
        "main_kernels": top(by_stream[main]),
        "side_kernels": top([e for s, es in by_stream.items() if s != main for e in es]),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--preset", default="llama-3.1-8b")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--budget", type=float, default=0.02)
    ap.add_argument("--variant", default="realistic", choices=["quest", "realistic", "worst"])
    ap.add_argument("--prefetch-programs", type=int, default=None)
    ap.add_argument("--prefetch-priority", default="normal", choices=["normal", "high"])
    ap.add_argument("--prefetch", nargs="+", default=["off", "forecast"])
    ap.add_argument("--gpu-budget", default="24GiB")
    ap.add_argument("--gpu-kv-budget", default="5GiB")
    add_bytes_options(ap, several_evictions=False)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip-prefill-attention", action="store_true",
                    help="build the context without prefill attention (dummy weights: decode "
                    "timing is unchanged; a 500K prefill takes seconds, not minutes)")  # fmt: skip
    ap.add_argument("--dense", action="store_true",
                    help="the dense path (no sparse config, KV on the GPU, no 24 GiB cap)")  # fmt: skip
    ap.add_argument("--json")
    ap.add_argument(
        "--trace", help="write each mode's graph-replay Chrome trace to TRACE.MODE.json"
    )
    args = ap.parse_args()
    from agentctx.kv_snapshots import parse_size
    from bench.scorers import SyntheticScorer, skip_prefill_attention, use_scorer
    from engine import Engine
    from engine.config import EngineConfig
    from engine.kv import SparseConfig

    n = args.context
    window = n + 64
    sparse = None if args.dense else SparseConfig(
        budget_fraction=args.budget, gpu_kv_budget=parse_size(args.gpu_kv_budget), forecast="free",
        eviction=args.eviction,
    )  # fmt: skip
    cfg = EngineConfig(max_model_len=window, max_num_seqs=1, sparse=sparse,
                       num_pages=-(-window // 16) + 64, max_num_batched_tokens=8192,
                       kv_dtype="auto" if args.dense else args.kv_dtype)  # fmt: skip
    if args.dense:
        args.prefetch = ["dense"]
    elif args.device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(parse_size(args.gpu_budget) / total)
    engine = Engine.load(f"dummy:{model_config(args)}", device=args.device, config=cfg,
                         weights=args.weights)  # fmt: skip
    if args.skip_prefill_attention:
        skip_prefill_attention(engine)
    prompts = prompts_for(n, 1, engine.model_config.vocab_size)
    timed_decode(engine, [p[:512] for p in prompts], 4)
    tiers, runner = engine.runner.tiers, engine.runner
    keep = {"quest": None, "realistic": MEASURED_LOCALITY, "worst": 0.0}[args.variant]
    synthetic = None if keep is None or args.dense else SyntheticScorer(tiers, keep)
    rows = []
    for prefetch in args.prefetch:
        if not args.dense:
            tiers.sparse.forecast = "off" if prefetch == "off" else "free"
            if synthetic is not None:
                synthetic.recall = 1.0 if prefetch == "oracle" else MEASURED_FORECAST_RECALL
            tiers.sparse.prefetch_programs = args.prefetch_programs
            tiers.sparse.prefetch_high_priority = args.prefetch_priority == "high"
            use_scorer(engine, synthetic)  # (and the graphs captured again)
        timed_decode(engine, prompts, 4)  # prefill (first time) and graph capture
        graph = timed_decode(engine, prompts, args.new_tokens)
        decode_graphs = runner.decode_graphs  # (None on the CPU: every step is eager)
        if decode_graphs is not None:
            graphs, decode_graphs.enabled = decode_graphs.enabled, False
        eager = timed_decode(engine, prompts, 8)
        table_eager, k_eager, gpu_eager, _ = profile(engine, prompts, 4)
        if decode_graphs is not None:
            decode_graphs.enabled = graphs
        trace = f"{args.trace}.{prefetch}.json" if args.trace else None
        table_graph, k_graph, gpu_graph, tl = profile(engine, prompts, 4, trace)
        row = {"prefetch": prefetch, "variant": "dense" if args.dense else args.variant, "context": n,
               "graph_ms_per_token": 1000 / graph["decode_tok_s_median_step"],
               "eager_ms_per_token": 1000 / eager["decode_tok_s_median_step"],
               "kernels_per_step_eager": k_eager, "gpu_ms_per_step_eager": gpu_eager,
               "kernels_per_step_graph": k_graph, "gpu_ms_per_step_graph": gpu_graph,
               "timeline_graph": tl}  # fmt: skip
        rows.append(row)
        print(f"\n=== prefetch {prefetch}: eager ops by GPU time ===\n{table_eager}")
        print(f"\n=== prefetch {prefetch}: graph replays, kernels by GPU time ===\n{table_graph}")
        print(json.dumps(row), flush=True)
    print()
    for r in rows:
        print(f"{r['variant']:>10} prefetch {r['prefetch']:>8}: graph {r['graph_ms_per_token']:6.2f} "
              f"ms/token, eager {r['eager_ms_per_token']:6.2f}; kernels/step {r['kernels_per_step_eager']}"
              f" (graph {r['kernels_per_step_graph']}), GPU busy {r['gpu_ms_per_step_eager']:.2f} / "
              f"{r['gpu_ms_per_step_graph']:.2f} ms per step")  # fmt: skip
        t = r["timeline_graph"]
        if t.get("error"):
            print(f"{'':>10} graph timeline: {t['error']}")
        elif t:
            print(
                f"{'':>10} graph timeline per step: span {t['span_ms']:.2f} ms, GPU busy "
                f"{t['gpu_busy_ms']:.2f}, main stream busy {t['main_busy_ms']:.2f}, other "
                f"streams {t['side_busy_ms']:.2f}, overlapped {t['overlap_ms']:.2f}, main idle "
                f"while another ran {t['main_idle_while_side_ms']:.2f} ({t['streams']} streams)"
            )
            if t["streams"] > 2:
                print(f"{'':>10} ({t['streams']} stream ids: the graph replay spread its kernels "
                      "over them, so the main/side split below mixes the two chains)")  # fmt: skip
            for kind, k in t["kinds"].items():
                print(f"{'':>10} {k['ms']:7.3f} ms  {k['kernels']:7.1f} kernels  {kind}")
            for side in ("main", "side"):
                for name, k in t[f"{side}_kernels"].items():
                    print(f"{'':>8}{side:>6} {k['n']:5d} x {k['mean_us']:7.1f} us  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
