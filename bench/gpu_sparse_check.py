"""Sparse decode inside the engine on a GPU, against dense decode: the Triton kernels
(scoring, sparse attention, gather) driven by the tiered cache.

python3 -m bench.gpu_sparse_check [--preset smollm2-135m] [--context 1500]

fp32 weights (dummy, seeded) so that dense and sparse attention differ only by summation
order. Checks, on three prompts of random tokens, 32 greedy tokens each:
- a budget that selects every page gives the dense tokens;
- a GPU tier far smaller than the context gives the tokens of an unlimited one.
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
    args = ap.parse_args()
    model = f"dummy:{args.preset}"
    params = SamplingParams(max_tokens=32, ignore_eos=True)

    def load(sparse=None):
        return Engine.load(model, device=args.device, dtype="float32",
                           config=EngineConfig(sparse=sparse, cuda_graphs=False))  # fmt: skip

    dense = load()
    vocab = dense.model_config.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(100, vocab) for _ in range(args.context)] for _ in range(3)]
    t = time.perf_counter()
    ref = [c.token_ids for c in dense.generate(prompts, params)]
    print(f"dense: {time.perf_counter() - t:.2f} s")
    full = load(SparseConfig(budget_fraction=1.0))
    t = time.perf_counter()
    got = [c.token_ids for c in full.generate(prompts, params)]
    print(f"sparse, every page: {time.perf_counter() - t:.2f} s; "
          f"[{'ok' if got == ref else 'FAIL'}] tokens == dense "
          f"({sum(a == b for a, b in zip(got, ref, strict=True))}/3 prompts)")  # fmt: skip
    cfg = full.model_config
    unit = 2 * 16 * cfg.head_dim * 4
    big = load(SparseConfig(budget_fraction=0.2))
    a = [c.token_ids for c in big.generate(prompts, params)]
    pages = -(-(args.context + 32) // 16)
    slots = 3 * (int(0.2 * pages) + 4) * cfg.num_kv_heads + 8  # the batch's working set
    tiny = load(SparseConfig(budget_fraction=0.2, gpu_kv_budget=cfg.num_layers * slots * unit))
    b = [c.token_ids for c in tiny.generate(prompts, params)]
    st = tiny.runner.tiers.stats
    print(f"[{'ok' if a == b else 'FAIL'}] 20% budget: tiny GPU tier ({tiny.runner.tiers.num_slots}"
          f" slots per layer for {pages * cfg.num_kv_heads * 3} pages x heads of context) == "
          f"unlimited; fetch fraction {st.fetch_fraction:.1%}, evicted {st.evicted}, "
          f"locality {st.locality:.1%}; vs dense {sum(x == y for x, y in zip(a, ref, strict=True))}/3")  # fmt: skip


if __name__ == "__main__":
    main()
