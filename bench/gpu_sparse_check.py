"""Sparse decode inside the engine on a GPU, against dense decode: the Triton kernels
(scoring, sparse attention, gather) driven by the tiered cache.

python3 -m bench.gpu_sparse_check [--preset smollm2-135m] [--context 1500]

fp32 weights (dummy, seeded) so that dense and sparse attention differ only by summation
order. Checks, on three prompts of random tokens, 32 greedy tokens each:
- a budget that selects every page gives the dense tokens;
- a GPU tier far smaller than the context gives the tokens of an unlimited one;
- the same, with the decode steps captured in CUDA graphs (slot allocation, eviction and
  fetches on the device; a batch of 3 in the graph of 4, one padding row) and with synthetic
  worst-case selections (fresh random pages every step).
"""

from __future__ import annotations

import argparse
import random
import time


def main() -> None:
    from engine import Engine, SamplingParams
    from engine.config import EngineConfig
    from engine.kv import SparseConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prefetch-only", action="store_true",
                    help="only the Forecast prefetch checks (against the unlimited tier)")  # fmt: skip
    args = ap.parse_args()
    model = f"dummy:{args.preset}"
    params = SamplingParams(max_tokens=32, ignore_eos=True)

    def load(sparse=None, graphs=False):
        return Engine.load(model, device=args.device, dtype="float32",
                           config=EngineConfig(sparse=sparse, cuda_graphs=graphs))  # fmt: skip

    dense = load()
    vocab = dense.model_config.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(100, vocab) for _ in range(args.context)] for _ in range(3)]
    cfg = dense.model_config
    unit = 2 * 16 * cfg.head_dim * 4
    pages = -(-(args.context + 32) // 16)
    slots = 4 * (int(0.2 * pages) + 4) * cfg.num_kv_heads + 8  # the batch's working set
    if args.prefetch_only:
        a = [c.token_ids for c in load(SparseConfig(budget_fraction=0.2)).generate(prompts, params)]
        prefetch_checks(load, prompts, params, cfg.num_layers * slots * unit, a)
        return
    t = time.perf_counter()
    ref = [c.token_ids for c in dense.generate(prompts, params)]
    print(f"dense: {time.perf_counter() - t:.2f} s")
    full = load(SparseConfig(budget_fraction=1.0))
    t = time.perf_counter()
    got = [c.token_ids for c in full.generate(prompts, params)]
    print(f"sparse, every page: {time.perf_counter() - t:.2f} s; "
          f"[{'ok' if got == ref else 'FAIL'}] tokens == dense "
          f"({sum(a == b for a, b in zip(got, ref, strict=True))}/3 prompts)")  # fmt: skip
    big = load(SparseConfig(budget_fraction=0.2))
    a = [c.token_ids for c in big.generate(prompts, params)]
    tiny = load(SparseConfig(budget_fraction=0.2, gpu_kv_budget=cfg.num_layers * slots * unit))
    b = [c.token_ids for c in tiny.generate(prompts, params)]
    st = tiny.runner.tiers.stats
    print(f"[{'ok' if a == b else 'FAIL'}] 20% budget: tiny GPU tier ({tiny.runner.tiers.num_slots}"
          f" slots per layer for {pages * cfg.num_kv_heads * 3} pages x heads of context) == "
          f"unlimited; fetch fraction {st.fetch_fraction:.1%}, evicted {st.evicted}, "
          f"locality {st.locality:.1%}; vs dense {sum(x == y for x, y in zip(a, ref, strict=True))}/3")  # fmt: skip
    graphs_check(load, prompts, params, cfg.num_layers * slots * unit, a)


def graphs_check(load, prompts, params, budget_bytes, expected) -> None:
    import torch

    from bench.scorers import SyntheticScorer, use_scorer

    def load_with(sparse, keep, graphs=False):
        engine = load(sparse, graphs=graphs)
        if keep is not None:  # synthetic selections: each page kept with probability `keep`
            use_scorer(engine, SyntheticScorer(engine.runner.tiers, keep=keep))
        return engine

    for name, keep in (("20% budget, tiny tier", None), ("synthetic worst case", 0.0)):
        from engine.kv import SparseConfig

        sparse = dict(budget_fraction=0.2)
        eager = load_with(SparseConfig(**sparse, gpu_kv_budget=budget_bytes), keep)
        torch.manual_seed(0)
        a = [c.token_ids for c in eager.generate(prompts, params)]
        graphed = load_with(SparseConfig(**sparse, gpu_kv_budget=budget_bytes), keep, graphs=True)
        torch.manual_seed(0)
        t = time.perf_counter()
        b = [c.token_ids for c in graphed.generate(prompts, params)]
        dt = time.perf_counter() - t
        st = graphed.runner.tiers.stats
        same = a == b if keep is None else len(b) == len(a)
        print(f"[{'ok' if same else 'FAIL'}] {name}: CUDA graphs ({len(graphed.runner.decode_graphs.graphs)} "
              f"captured) {'==' if a == b else '!='} eager; {dt:.2f} s; fetch "
              f"{st.fetch_fraction:.1%}, evicted {st.evicted}, locality {st.locality:.1%}, "
              f"steps {st.steps}")  # fmt: skip
        if keep is None:
            print(f"    vs the unlimited tier: {'ok' if b == expected else 'FAIL'}")
    prefetch_checks(load, prompts, params, budget_bytes, expected)


def prefetch_checks(load, prompts, params, budget_bytes, expected) -> None:
    """Forecast prefetch on the side stream, inside the CUDA graphs: the same tokens, with
    each predictor and with the "auto" and "timed" policies switching graphs."""
    from engine.kv import SparseConfig

    for forecast in ("free", "trained"):
        sparse = SparseConfig(budget_fraction=0.2, gpu_kv_budget=budget_bytes, forecast=forecast)
        graphed = load(sparse, graphs=True)
        got = [c.token_ids for c in graphed.generate(prompts, params)]
        st = graphed.runner.tiers.stats
        print(f"[{'ok' if got == expected else 'FAIL'}] Forecast {forecast} prefetch in CUDA "
              f"graphs == no prefetch; recall {st.recall:.1%}, prefetched {st.prefetched}, "
              f"hits {st.prefetch_hits}, on demand {st.demand_fetched}")  # fmt: skip
    # the "auto" policy switching between the prefetching and the plain graphs: a threshold
    # between two steps' needs so that it flips, read back with the tokens (launch ahead)
    sparse = SparseConfig(budget_fraction=0.2, gpu_kv_budget=budget_bytes, forecast="free",
                          prefetch_policy="auto", prefetch_on_mib=1e-6, prefetch_off_mib=0.0)  # fmt: skip
    graphed = load(sparse, graphs=True)
    got = [c.token_ids for c in graphed.generate(prompts, params)]
    tiers = graphed.runner.tiers
    st = tiers.stats
    keys = sorted({k[2] for k in graphed.runner.decode_graphs.graphs if isinstance(k, tuple)})
    ok = got == expected and st.prefetched > 0 and keys == [False, True]
    print(f"[{'ok' if ok else 'FAIL'}] auto prefetch policy in CUDA graphs == no prefetch; "
          f"graphs prefetching {keys}, need {tiers.need_mib:.3f} MiB per layer-step, "
          f"prefetched {st.prefetched}, hits {st.prefetch_hits}")  # fmt: skip
    # the "timed" policy: 3 steps timed each way by the graphs' events, then the faster
    sparse = SparseConfig(budget_fraction=0.2, gpu_kv_budget=budget_bytes, forecast="free",
                          prefetch_policy="timed", prefetch_on_mib=1e-6, prefetch_off_mib=0.0,
                          trial_steps=3)  # fmt: skip
    graphed = load(sparse, graphs=True)
    got = [c.token_ids for c in graphed.generate(prompts, params)]
    tiers = graphed.runner.tiers
    keys = sorted({k[2] for k in graphed.runner.decode_graphs.graphs if isinstance(k, tuple)})
    dec = tiers.trials.decisions
    ok = got == expected and keys == [False, True] and len(dec) >= 1
    print(f"[{'ok' if ok else 'FAIL'}] timed prefetch policy in CUDA graphs == no prefetch; "
          f"graphs prefetching {keys}, trials (ms off, on) {[tuple(round(x, 3) for x in d) for d in dec]}, "
          f"prefetching now {tiers.prefetching()}")  # fmt: skip


if __name__ == "__main__":
    main()
