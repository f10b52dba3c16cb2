"""End-to-end decode with the tiered sparse cache against dense-resident decode (dummy 8B).

python3 -m bench.e2e_sparse [--contexts 32768 131072] [--budget 0.02] [--gpu-kv-budget 6GiB]

Dense-resident: the whole KV in GPU memory, paged decode kernel, CUDA graphs. Sparse: the
KV pool in pinned host memory, a GPU slot pool of `--gpu-kv-budget` (the weights take 16 GB,
so 6 GiB keeps the process near 24 GiB), per-layer selection and fetch, eager (no graphs).
Dummy weights make attention meaningless; the prompt is random tokens. Decode tok/s over
`--new-tokens` greedy tokens after the prompt, batch 1.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch


def run(engine, ids, n_new) -> dict:
    from engine import SamplingParams

    req = engine.add_request(ids, SamplingParams(max_tokens=n_new, ignore_eos=True))
    t0 = time.perf_counter()
    first = None
    while not req.done:
        engine.step()
        if first is None and req.stats.completion_tokens:
            torch.cuda.synchronize()
            first = time.perf_counter()
    torch.cuda.synchronize()
    end = time.perf_counter()
    n = req.stats.completion_tokens
    return {"prefill_s": first - t0, "decode_tok_s": (n - 1) / (end - first),
            "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30}  # fmt: skip


def main() -> None:
    from agentctx.kv_snapshots import parse_size
    from engine import Engine
    from engine.config import EngineConfig
    from engine.kv import SparseConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131000])
    ap.add_argument("--budget", type=float, default=0.02)
    ap.add_argument("--gpu-kv-budget", default="6GiB")
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    rows = []
    for n in args.contexts:
        window = n + args.new_tokens + 16
        rng = random.Random(n)
        for mode in ("dense", "sparse"):
            sparse = None
            if mode == "sparse":
                sparse = SparseConfig(budget_fraction=args.budget,
                                      gpu_kv_budget=parse_size(args.gpu_kv_budget))  # fmt: skip
            cfg = EngineConfig(max_model_len=window, max_num_seqs=1, sparse=sparse,
                               max_num_batched_tokens=min(window, 16384),
                               num_pages=-(-window // 16) + 8)  # fmt: skip
            torch.cuda.reset_peak_memory_stats()
            engine = Engine.load("dummy:llama-3.1-8b", device="cuda", config=cfg)
            ids = [rng.randrange(100, engine.model_config.vocab_size) for _ in range(n)]
            run(engine, ids[:512], 4)  # warm up
            row = {"context": n, "mode": mode, **run(engine, ids, args.new_tokens)}
            if engine.runner.tiers is not None:
                st = engine.runner.tiers.stats
                row.update(fetch_fraction=st.fetch_fraction, locality=st.locality,
                           slots_per_layer=engine.runner.tiers.num_slots)  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
            del engine
            torch.cuda.empty_cache()
    for r in rows:
        print(f"{r['context']:>7} {r['mode']:>6} prefill {r['prefill_s']:7.2f} s  decode "
              f"{r['decode_tok_s']:7.2f} tok/s  peak GPU {r['peak_gpu_gib']:5.1f} GiB"
              + (f"  host fetch {r['fetch_fraction']:.1%}" if "fetch_fraction" in r else ""))  # fmt: skip


if __name__ == "__main__":
    main()
