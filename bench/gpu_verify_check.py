"""Speculative verification in CUDA graphs (engine.runtime.verify_graphs) against the eager
verification, on a GPU, over the tiered sparse cache with a GPU tier much smaller than the
context (dummy fp32 SmolLM2-135M shape, three 1,500-token random prompts, batch 3 in the
graph of 4).

python3 -m bench.gpu_verify_check [--preset smollm2-135m] [--context 1500]

Checks and times:
- one verification of k = 1, 4, 8 drafted tokens per sequence, graph against eager, on the
  same inputs: the logits (max abs difference; the graph pads the batch and lists each
  union in a fixed width, so the last bits may differ) and their argmax;
- 48 greedy tokens with speculation (drafts of the plain output with every third token
  corrupted, so sequences accept different counts), graphs against eager: the same tokens,
  with how many verifications replayed a graph and how many fell back (a union wider than
  the graph's);
- wall time of a verification, graph against eager.
"""

from __future__ import annotations

import argparse
import random
import time


def main() -> None:
    import torch

    from engine import Engine, SamplingParams
    from engine.config import EngineConfig
    from engine.kv import SparseConfig
    from engine.runtime.scheduler import ScheduledSeq, SchedulerOutput
    from engine.spec.decoder import SpecConfig, SpecDecoder
    from engine.spec.proposers import Draft, Proposer

    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    n_new = 48
    params = SamplingParams(max_tokens=n_new, ignore_eos=True)

    def load():
        probe = Engine.load(f"dummy:{args.preset}", device=args.device, dtype="float32",
                            config=EngineConfig())  # fmt: skip
        cfg = probe.model_config
        del probe
        pages = -(-(args.context + n_new + 16) // 16)
        unit = 2 * 16 * cfg.head_dim * 4
        slots = 4 * 9 * (int(0.2 * pages) + 4) * cfg.num_kv_heads  # 4 sequences x 9 queries
        sparse = SparseConfig(budget_fraction=0.2, gpu_kv_budget=cfg.num_layers * slots * unit)
        return Engine.load(f"dummy:{args.preset}", device=args.device, dtype="float32",
                           config=EngineConfig(sparse=sparse, cuda_graphs=True))  # fmt: skip

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    engine = load()
    runner = engine.runner
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(100, vocab) for _ in range(args.context)] for _ in range(3)]
    truth = [c.token_ids for c in engine.generate(prompts, params)]

    # one verification, graph against eager, on the same inputs
    reqs = [engine.add_request(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in prompts]
    while not all(r.stats.completion_tokens >= 4 for r in reqs):
        engine.step()
    seqs = [r.seq for r in reqs]
    for k in (1, 4, 8):
        for s in seqs:
            assert engine.block_manager.ensure_capacity(s, len(s) + k)
        out = SchedulerOutput([ScheduledSeq(s, k + 1, True, draft=tuple(
            rng.randrange(100, vocab) for _ in range(k))) for s in seqs], [])  # fmt: skip
        times = {}
        logits = {}
        for mode in (False, True):
            runner.verify_graphs.enabled = mode
            logits[mode] = runner.verify(out).float().clone()  # (captures the graph)
            sync()
            t = time.perf_counter()
            for _ in range(5):
                runner.verify(out)
            sync()
            times[mode] = (time.perf_counter() - t) / 5 * 1000
        diff = (logits[True] - logits[False]).abs().max().item()
        same = torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
        print(f"[{'ok' if same and diff < 1e-3 else 'FAIL'}] k={k}: graph vs eager logits max "
              f"abs diff {diff:.2e}, argmax {'equal' if same else 'DIFFERENT'}; wall "
              f"{times[False]:.1f} ms eager, {times[True]:.1f} ms graph "
              f"({times[False] / times[True]:.1f}x)")  # fmt: skip
    for r in reqs:
        r.cancelled.set()
    engine.step()

    class Corrupted(Proposer):
        """Drafts the plain output with every third drafted token wrong."""

        name = "corrupted"

        def propose(self, seq, k, generator=None) -> Draft:
            done = len(seq.completion_token_ids)
            want = truth[prompts.index(seq.token_ids[: args.context])][done : done + k]
            toks = [t if i % 3 != 2 else (t + 1) % vocab for i, t in enumerate(want)]
            return Draft(toks)

    got = {}
    for mode in (False, True):
        runner.verify_graphs.enabled = mode
        runner.verify_graphs.replays = runner.verify_graphs.fallbacks = 0
        cfg = SpecConfig("lookup", max_k=8, start_k=4, adaptive=False)
        engine.spec = SpecDecoder(runner, engine.block_manager, cfg, Corrupted())
        engine.block_manager.reset_prefix_cache()
        t = time.perf_counter()
        got[mode] = [c.token_ids for c in engine.generate(prompts, params)]
        dt = time.perf_counter() - t
        print(f"    speculation, verification {'in graphs' if mode else 'eager'}: {dt:.2f} s, "
              f"{runner.verify_graphs.replays} graph replays, "
              f"{runner.verify_graphs.fallbacks} fallbacks; "
              f"tokens == plain decoding {sum(a == b for a, b in zip(got[mode], truth, strict=True))}/3")  # fmt: skip
    print(f"[{'ok' if got[True] == got[False] else 'FAIL'}] speculative tokens, graphs == eager "
          f"({sum(a == b for a, b in zip(got[True], got[False], strict=True))}/3)")  # fmt: skip


if __name__ == "__main__":
    main()
