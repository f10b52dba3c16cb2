"""End-to-end decode with the tiered sparse KV cache (dummy 8B weights), against our own
dense-resident mode and against transformers with its offloaded KV cache, in one process.

python3 -m bench.e2e_sparse --context 131072 --batch 1 [--dense] [--hf] \
    [--variants quest recurring realistic worst] [--budget 0.02] [--gpu-budget 24GiB] \
    [--gpu-kv-budget 5GiB] [--new-tokens 32] [--json out.json]

- sparse (ours): the KV pool in pinned host memory (write-through), a GPU slot pool of
  `--gpu-kv-budget`, `--budget` of each sequence's pages selected per (layer, KV head) and
  step, decode steps in CUDA graphs. The whole process is capped at `--gpu-budget` of GPU
  memory (torch.cuda.set_per_process_memory_fraction: an allocation past it fails) for the
  prefill and the decode. Selection variants, on the same prefilled context (the prompts
  are submitted again and come from the prefix cache):
  - quest: the real path, Quest scores from the page summaries (with dummy weights the
    scores are meaningless, but the work is the real work);
  - realistic: random selections that keep each page read at the step before with
    probability `--locality` (0.77: Qwen2.5-Coder-0.5B's step-to-step locality at 131K
    tokens on the H200, bench.scorers.MEASURED_LOCALITY);
  - recurring: realistic, except that `--recurring` (0.86, the same run's) of the pages
    not kept from the step before are drawn from pages the sequence read at earlier steps,
    as the real model's are (realistic draws them all at random, so it fetches several
    times what the real selections need);
  - worst: a fresh random selection every step (locality 0: sinks and window only).
- dense-resident (ours, `--dense`): all KV on the GPU, paged decode kernel, CUDA graphs; not
  capped (at 128K it needs 34 GiB).
- transformers (`--hf`): `generate` with `cache_implementation="offloaded"` (each layer's KV
  on the host, the next layer's prefetched), SDPA, bf16, the same random prompt; not capped.

Decode tok/s counts every sequence's tokens between the moment all sequences have their
first token and the moment the first one finishes. Dummy weights: token values mean nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from bench.scorers import MEASURED_FORECAST_RECALL, MEASURED_LOCALITY, MEASURED_RECURRING

GiB = 2**30


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def graph_count(engine) -> int:
    """The decode graphs captured (none without CUDA graphs)."""
    graphs = engine.runner.decode_graphs
    return len(graphs.graphs) if graphs is not None else 0


def memory() -> dict:
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"peak_allocated_gib": torch.cuda.max_memory_allocated() / GiB,
            "device_used_gib": (total - free) / GiB}  # fmt: skip


def timed_decode(engine, prompts: list[list[int]], n_new: int) -> dict:
    """Submit every prompt, step to the end; decode tok/s over the window where every
    sequence decodes."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=n_new, ignore_eos=True)
    t0 = time.perf_counter()
    reqs = [engine.add_request(p, params) for p in prompts]
    start = stop = None
    steps = []  # (time, tokens so far) after each step of the window
    while not all(r.done for r in reqs):
        engine.step()
        counts = [r.stats.completion_tokens for r in reqs]
        if start is not None and stop is None:
            steps.append((time.perf_counter(), sum(counts)))
        if start is None and all(counts):
            sync()
            start = (time.perf_counter(), sum(counts))
        if start is not None and stop is None and any(r.done for r in reqs):
            sync()
            stop = (time.perf_counter(), sum(counts))
    tokens = stop[1] - start[1]
    # the median step: robust to a one-off stall (a graph capture, a compile)
    gaps = sorted((t1 - t0_) / max(1, n1 - n0) for (t0_, n0), (t1, n1) in
                  zip([start, *steps], steps, strict=False) if n1 > n0)  # fmt: skip
    median = gaps[len(gaps) // 2] if gaps else float("nan")
    return {"prefill_s": start[0] - t0, "decode_tok_s": tokens / (stop[0] - start[0]),
            "decode_tok_s_median_step": 1 / median, "decode_tokens": tokens,
            "cached_tokens": sum(r.stats.cached_tokens for r in reqs)}  # fmt: skip


def model_spec(args) -> dict:
    """The preset with a window that holds the context (Llama-3.1-8B's is 128K tokens;
    RoPE past it is extrapolation, which dummy weights do not mind)."""
    from engine.loading.loader import DUMMY_PRESETS

    spec = dict(DUMMY_PRESETS[args.preset])
    need = args.context + args.new_tokens + 64
    spec["max_position_embeddings"] = max(spec["max_position_embeddings"], need)
    return spec


def model_config(args) -> str:
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(json.dumps(model_spec(args)))
    return str(path)


def prompts_for(n: int, batch: int, vocab: int) -> list[list[int]]:
    rng = random.Random(n)
    return [[rng.randrange(100, vocab) for _ in range(n)] for _ in range(batch)]


def run_ours(args, mode: str, picked: dict | None = None) -> list[dict]:
    """`picked`: gets the top-k method the engine timed and picked per selection shape."""
    from agentctx.kv_snapshots import parse_size
    from bench.scorers import SyntheticScorer, skip_prefill_attention, use_scorer
    from engine import Engine
    from engine.config import EngineConfig
    from engine.kv import SparseConfig

    n, b = args.context, args.batch
    window = n + args.new_tokens + 32
    sparse = None
    if mode == "sparse":
        sparse = SparseConfig(budget_fraction=args.budget, summary="quest",
                              gpu_kv_budget=parse_size(args.gpu_kv_budget),
                              eviction=args.eviction[0],
                              forecast="off" if args.prefetch == ["off"] else "free")  # fmt: skip
    pages = b * -(-window // 16) + 4 * b + 64  # every prompt stays cached between variants
    cfg = EngineConfig(max_model_len=window, max_num_seqs=b, sparse=sparse, num_pages=pages,
                       max_num_batched_tokens=min(window, args.chunk),
                       kv_dtype=args.kv_dtype if mode == "sparse" else "auto")  # fmt: skip
    capped = mode == "sparse" and torch.cuda.is_available()
    if capped:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(parse_size(args.gpu_budget) / total)
    torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
    engine = Engine.load(f"dummy:{model_config(args)}", device=args.device, config=cfg,
                         weights=args.weights)  # fmt: skip
    if args.skip_prefill_attention:
        skip_prefill_attention(engine)
    # the synthetic selections (one scorer: what each row read carries over between variants)
    synthetic = None if engine.runner.tiers is None else SyntheticScorer(engine.runner.tiers, 0.0)
    prompts = prompts_for(n, b, engine.model_config.vocab_size)
    timed_decode(engine, [p[:512] for p in prompts], 4)  # warm-up: kernels compile
    rows = []
    variants = args.variants if mode == "sparse" else ["dense-resident"]
    runs = [(v, p, g, hi, e) for e in (args.eviction if mode == "sparse" else ["value"])
            for v in variants for p in (args.prefetch if mode == "sparse" else ["off"])
            for g in (args.prefetch_programs if p != "off" else [None])
            for hi in (args.prefetch_priority if p != "off" else ["normal"])
            if not (v == "quest" and p == "oracle")]  # fmt: skip
    first = runs[0]
    for variant, prefetch, programs, priority, eviction in runs:
        tiers = engine.runner.tiers
        if tiers is not None:
            tiers.sparse.eviction = eviction  # (from the next step on)
            tiers.residency.set_eviction(eviction)
            keep = {"quest": None, "realistic": args.locality, "recurring": args.locality,
                    "worst": 0.0}[variant]  # fmt: skip
            synthetic.keep = keep
            synthetic.recurring = args.recurring if variant == "recurring" else 0.0
            # prefetch: the training-free Forecast on the real path; on the synthetic
            # selections a simulated predictor at its measured recall, or the oracle
            tiers.sparse.forecast = "off" if prefetch == "off" else "free"
            # "auto": the forecast prefetch only while steps need much from the host;
            # "timed": then only if steps timed both ways run faster with it
            tiers.sparse.prefetch_policy = prefetch if prefetch in ("auto", "timed") else "always"
            tiers.policy.reset()
            synthetic.recall = 1.0 if prefetch == "oracle" else args.forecast_recall
            tiers.sparse.prefetch_programs = programs
            tiers.sparse.prefetch_high_priority = priority == "high"
            # (the graphs are captured again: the selection path is part of them)
            use_scorer(engine, None if keep is None else synthetic)
            # capture this variant's graph at this length (the first variant: the prefill)
            # ("timed": long enough for its first trial, 2 + 8 steps each way, to decide)
            warm = timed_decode(engine, prompts, 4 if prefetch != "timed" else 32)
            tiers.reset_stats()
        row = {"context": n, "batch": b, "mode": mode, "variant": variant, "prefetch": prefetch,
               "prefetch_programs": programs, "prefetch_priority": priority,
               "eviction": eviction, "weights": args.weights,
               "kv_dtype": args.kv_dtype if mode == "sparse" else "auto", **timed_decode(engine, prompts, args.new_tokens), **memory()}  # fmt: skip
        if tiers is not None and (variant, prefetch, programs, priority, eviction) == first:
            row["prefill_s"] = warm["prefill_s"]  # the timed run found the prompt cached
        if tiers is not None:
            st = tiers.stats
            row.update(fetch_fraction=st.fetch_fraction, locality=st.locality,
                       selected_per_layer_step=st.selected / max(1, st.steps),
                       fetched_mb_per_token=st.fetched_bytes / max(1, st.steps) * tiers.L / 1e6,
                       slots_per_layer=tiers.num_slots, graphs=graph_count(engine),
                       recall=st.recall if st.recall_total else None,
                       critical_mb_per_token=st.demand_fetched * tiers.unit_bytes
                       / max(1, st.steps) * tiers.L / 1e6,
                       prefetched_mb_per_token=st.prefetched * tiers.unit_bytes
                       / max(1, st.steps) * tiers.L / 1e6,
                       capped_gib=parse_size(args.gpu_budget) / GiB if capped else None,
                       prefetch_on=tiers.prefetching(), need_mib=tiers.need_mib,
                       trials=list(tiers.trials.decisions))  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    if picked is not None and engine.runner.tiers is not None:
        picked.update(engine.runner.tiers.select_methods.chosen_methods())
    del engine
    if capped:
        torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return rows


def run_transformers(args) -> dict:
    """transformers `generate`, greedy, with the offloaded cache; token times from a
    streamer (its put() is called with each step's tokens; reading them waits for them)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    n, b = args.context, args.batch
    spec = {k: v for k, v in model_spec(args).items() if k != "architectures"}
    hf_cfg = LlamaConfig(**spec)
    hf_cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    with torch.device(args.device):
        model = LlamaForCausalLM(hf_cfg).eval()
    torch.set_default_dtype(default)
    ids = torch.tensor(prompts_for(n, b, hf_cfg.vocab_size), device=args.device)

    class Clock:
        def __init__(self):
            self.times = []

        def put(self, value):
            value.cpu()
            self.times.append(time.perf_counter())

        def end(self):
            pass

    def generate(tokens, new, model=model):
        clock = Clock()
        model.generate(tokens, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       pad_token_id=0, cache_implementation=args.hf_cache, streamer=clock)  # fmt: skip
        return clock.times

    generate(ids[:, :512], 4)  # warm-up
    t0 = time.perf_counter()
    times = generate(ids, args.hf_new_tokens or args.new_tokens)
    # times[0]: the prompt handed to the streamer; times[1]: the first new token
    row = {"context": n, "batch": b, "mode": f"transformers ({args.hf_cache} cache)",
           "variant": "-", "prefill_s": times[1] - t0,
           "decode_tok_s": b * (len(times) - 2) / (times[-1] - times[1]), **memory()}  # fmt: skip
    print(json.dumps(row), flush=True)
    del model
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return row


def _transformers_child(args, queue) -> None:
    try:
        queue.put(run_transformers(args))
    except torch.OutOfMemoryError as e:  # a peer that cannot run is a result too
        queue.put({"error": str(e).splitlines()[0]})


def transformers_in_child(args) -> list[dict]:
    """The transformers peer in a child process of this run: the host memory of its
    offloaded cache (61 GiB at 500K, held by the pinned-memory cache after use) goes back
    to the system before our engine asks for its own pool."""
    import multiprocessing
    import queue as queue_errors

    mp = multiprocessing.get_context("spawn")
    queue = mp.Queue()
    child = mp.Process(target=_transformers_child, args=(args, queue))
    child.start()
    while True:  # a child that dies without a word (killed) must not hang the run
        try:
            row = queue.get(timeout=5)
            break
        except queue_errors.Empty:
            if not child.is_alive():
                row = {"error": f"the child process ended with code {child.exitcode}"}
                break
    child.join()
    if "error" in row:
        print(f"transformers failed: {row['error']}", flush=True)
        return []
    return [row]


def add_bytes_options(ap, several_evictions: bool) -> None:
    """--weights, --kv-dtype and --eviction (here and in bench.profile_decode)."""
    ap.add_argument("--weights", default="dense", choices=["dense", "int4"],
                    help="int4: every layer's linears as 4-bit groups (the W4A16 kernel)")  # fmt: skip
    ap.add_argument("--kv-dtype", default="auto", choices=["auto", "fp8"],
                    help="the KV pool's dtype, both tiers (EngineConfig.kv_dtype)")  # fmt: skip
    from engine.kv.sparse_config import SparseConfig

    engine_default = SparseConfig.__dataclass_fields__["eviction"].default
    ap.add_argument("--eviction", nargs="+" if several_evictions else None,
                    default=[engine_default] if several_evictions else engine_default,
                    choices=["value", "clock"],
                    help="the GPU tier's eviction (SparseConfig.eviction; its default)"
                    + (": each over the same engine" if several_evictions else ""))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--preset", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", type=float, default=0.02)
    ap.add_argument("--variants", nargs="+", default=["quest", "realistic", "worst"],
                    choices=["quest", "recurring", "realistic", "worst"])  # fmt: skip
    ap.add_argument("--locality", type=float, default=MEASURED_LOCALITY)
    ap.add_argument("--recurring", type=float, default=MEASURED_RECURRING,
                    help="the recurring variant's share of new pages read before")  # fmt: skip
    ap.add_argument("--prefetch", nargs="+", default=["off"], choices=["off", "forecast", "auto", "timed", "oracle"],
                    help="Forecast prefetch modes to compare (issue 6)")  # fmt: skip
    ap.add_argument("--forecast-recall", type=float, default=MEASURED_FORECAST_RECALL,
                    help="the simulated predictor's recall on synthetic selections (the "
                    "trained Forecast's on Qwen2.5-Coder-0.5B at 131K, 2%%: 0.89)")  # fmt: skip
    ap.add_argument(
        "--prefetch-programs",
        type=int,
        nargs="+",
        default=[None],
        help="the prefetch gather's programs (default: 16); one run each",
    )
    ap.add_argument("--prefetch-priority", nargs="+", default=["normal"], choices=["normal", "high"],
                    help="the prefetch stream's priority; one run each")  # fmt: skip
    ap.add_argument("--gpu-budget", default="24GiB")
    ap.add_argument("--gpu-kv-budget", default="5GiB")
    add_bytes_options(ap, several_evictions=True)
    ap.add_argument("--chunk", type=int, default=8192, help="prefill tokens per step")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dense", action="store_true", help="also our dense-resident mode")
    ap.add_argument("--hf", action="store_true", help="also transformers, offloaded cache")
    ap.add_argument("--hf-cache", default="offloaded")
    ap.add_argument("--hf-new-tokens", type=int, default=None,
                    help="transformers' decode tokens (default: --new-tokens); at 500K its "
                    "offloaded cache moves ~61 GiB per token")  # fmt: skip
    ap.add_argument("--skip-prefill-attention", action="store_true",
                    help="build the context without prefill attention (dummy weights: decode "
                    "timing is unchanged; a 500K prefill takes seconds, not minutes)")  # fmt: skip
    ap.add_argument("--json")
    args = ap.parse_args()
    rows, methods = [], {}
    if args.hf:
        rows += transformers_in_child(args)
    if args.dense:
        rows += run_ours(args, "dense")
    rows += run_ours(args, "sparse", methods)
    print(f"\ncontext {args.context}, batch {args.batch}, budget {args.budget:.1%}, "
          f"GPU KV tier {args.gpu_kv_budget}, cap {args.gpu_budget} (sparse only)"
          + (", prefill attention skipped" if args.skip_prefill_attention else ""))  # fmt: skip
    for r in rows:
        extra = ""
        if "fetch_fraction" in r:
            extra = (f"  host fetch {r['fetch_fraction']:6.1%}  locality {r['locality']:6.1%}  "
                     f"{r['fetched_mb_per_token']:7.1f} MB/token")  # fmt: skip
        mem = f"  peak {r['peak_allocated_gib']:5.1f} GiB" if "peak_allocated_gib" in r else ""
        med = r.get("decode_tok_s_median_step")
        med = f" (median step {med:8.2f})" if med else ""
        pf = f" {r.get('prefetch', '-'):>8}"
        if r.get("prefetch_programs"):
            pf += f"/{r['prefetch_programs']}"
        if r.get("prefetch_priority") == "high":
            pf += "/hi"
        if r["mode"] == "sparse":  # (weights, KV dtype, eviction)
            pf += f" {r['weights']}/{r['kv_dtype']}/{r['eviction']}"
        if r.get("recall") is not None:
            extra += (f"  recall {r['recall']:6.1%}  critical {r['critical_mb_per_token']:6.1f} "
                      f"MB/token")  # fmt: skip
        print(f"{r['mode']:>30} {r['variant']:>14}{pf}  prefill {r['prefill_s']:7.2f} s  decode "
              f"{r['decode_tok_s']:8.2f} tok/s{med}{mem}{extra}")  # fmt: skip
    # the top-k method the engine timed and picked per selection shape (rows, pages,
    # budget, width): engine.kv.select_methods
    picked = {str(k): m for k, m in methods.items()}
    print(f"select methods picked: {picked}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "select_methods": picked}, f, indent=1)


if __name__ == "__main__":
    main()
