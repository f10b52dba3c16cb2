"""Turn-2 time to first token with KV reuse against a cold prefill, and KV snapshots.

For each context size N, in one process and one engine, `--rounds` times:
1. turn 1: a session prefills an N-token prompt and answers `--answer` tokens;
2. turn 2 (reuse): the prompt is turn 1's tokens plus a `--question`-token follow-up; the
   session hands its pinned pages over and only the rest is prefilled. TTFT is measured;
3. snapshot: the session's KV is saved to a file (time, size), the session closed and the
   prefix cache emptied (as after a restart), then restored from the file (time) and turn 2
   run again on the restored pages (TTFT);
4. cold: the prefix cache emptied, the same turn-2 prompt prefilled from scratch (TTFT).
Reported: medians, ratios cold / reuse and cold / (load + reuse-after-load TTFT).

CPU, default model:  python -m bench.kv_reuse --contexts 7000
GPU, 8B shape:       python -m bench.kv_reuse --model dummy:llama-3.1-8b --device cuda \
                         --contexts 32768 131072 --rounds 2 --snapshot-dir /tmp/kv
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time


def sync(engine) -> None:
    import torch

    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def ttft(stream) -> float:
    for event in stream:
        if event.kind == "done":
            return event.stats.ttft_s
    raise RuntimeError("stream ended without a done event")


def prompt_ids(engine, n: int, seed: int) -> list[int]:
    if engine.tokenizer is None:  # dummy weights: random ids of the model's vocabulary
        rng = random.Random(seed)
        return [rng.randrange(100, engine.model_config.vocab_size) for _ in range(n)]
    from bench.cpu_generate import text_tokens

    return text_tokens(engine.tokenizer, n)


def one_round(engine, n: int, args, path: str, seed: int) -> dict:
    from engine import SamplingParams

    bm = engine.block_manager
    bm.reset_prefix_cache()  # nothing left from the last round
    answer = SamplingParams(max_tokens=args.answer, ignore_eos=True)
    first = SamplingParams(max_tokens=1, ignore_eos=True)
    ids1 = prompt_ids(engine, n, seed)
    rng = random.Random(seed + 1)
    vocab = engine.model_config.vocab_size
    follow = [rng.randrange(100, vocab) for _ in range(args.question)]

    s = engine.open_session(f"bench-{seed}")
    t1 = ttft(s.stream(ids1, answer))
    ids2 = s.token_ids + follow
    reuse_stream = s.stream(ids2, first)
    t_reuse = ttft(reuse_stream)
    reused = reuse_stream.request.stats.cached_tokens
    # undo turn 2 so the session holds turn 1 only, as it would when saved at exit
    s.close()
    bm.reset_prefix_cache()

    s = engine.open_session(f"bench-{seed}-b")
    ttft(s.stream(ids1, answer))
    assert s.token_ids[: len(ids1)] == ids1
    sync(engine)
    t = time.perf_counter()
    s.save(path)
    t_save = time.perf_counter() - t
    size = os.path.getsize(path)
    saved_tokens = s.num_cached_tokens
    tokens_turn1 = list(s.token_ids)
    s.close()
    bm.reset_prefix_cache()  # nothing cached: as a new process

    t = time.perf_counter()
    r = engine.open_session(f"bench-{seed}-r", snapshot=path)
    sync(engine)
    t_load = time.perf_counter() - t
    assert r.snapshot_error is None, r.snapshot_error
    ids2b = tokens_turn1 + follow
    restored_stream = r.stream(ids2b, first)
    t_restored = ttft(restored_stream)
    restored_reused = restored_stream.request.stats.cached_tokens
    r.close()
    bm.reset_prefix_cache()

    cold_stream = engine.stream(ids2b, first)
    t_cold = ttft(cold_stream)
    assert cold_stream.request.stats.cached_tokens == 0
    # the first answer token from restored KV against a full prefill of the same prompt
    same = restored_stream.token_ids == cold_stream.token_ids
    os.unlink(path)
    return {
        "turn1_ttft_s": t1,
        "turn2_tokens": len(ids2),
        "reused_tokens": reused,
        "reuse_ttft_s": t_reuse,
        "cold_ttft_s": t_cold,
        "save_s": t_save,
        "load_s": t_load,
        "snapshot_tokens": saved_tokens,
        "snapshot_bytes": size,
        "restored_reused_tokens": restored_reused,
        "restored_ttft_s": t_restored,
        "same_first_token": float(same),
    }


def main() -> None:
    import torch

    from engine import Engine
    from engine.config import EngineConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="default model when left out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--contexts", type=int, nargs="+", default=[7000])
    ap.add_argument("--answer", type=int, default=32, help="turn 1's answer tokens")
    ap.add_argument("--question", type=int, default=32, help="turn 2's new prompt tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--snapshot-dir", default=None)
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args()

    rows = []
    for n in args.contexts:
        window = n + args.answer + args.question + 64
        cfg = EngineConfig(
            max_model_len=window,
            max_num_seqs=4,
            # GPU: 16K-token prefill chunks (memory-efficient attention, lower-right causal)
            max_num_batched_tokens=min(window, 16384) if args.device == "cuda" else 512,
        )
        if args.device == "cuda":  # room for the session, a restored copy and slack
            from engine.kv.pool import KVCache
            from engine.loading.loader import read_config, resolve_source

            mcfg = read_config(resolve_source(args.model))
            per_token = KVCache.bytes_per_page(mcfg, 16, torch.bfloat16) // 16
            cfg.kv_cache_memory = int(2.5 * window * per_token)
        kw = {"weights": args.weights} if args.model is None else {}
        engine = Engine.load(args.model, device=args.device, config=cfg, **kw)
        d = args.snapshot_dir or tempfile.gettempdir()
        os.makedirs(d, exist_ok=True)
        # warm up every path (prefill, reuse, save, load) on a small context
        one_round(engine, 512, args, os.path.join(d, "warmup.kv"), seed=99)
        results = [
            one_round(engine, n, args, os.path.join(d, f"bench-{n}-{i}.kv"), seed=i)
            for i in range(args.rounds)
        ]
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        med.update(
            context=n,
            rounds=args.rounds,
            model=engine.name,
            device=str(engine.device),
            weights=engine.weights_mode,
            dtype=str(engine.dtype).replace("torch.", ""),
            ratio_reuse=med["cold_ttft_s"] / med["reuse_ttft_s"],
            ratio_restored=med["cold_ttft_s"] / (med["load_s"] + med["restored_ttft_s"]),
            mb_per_1k_tokens=med["snapshot_bytes"] / med["snapshot_tokens"] * 1000 / 1e6,
            cold_prefill_tok_s=med["turn2_tokens"] / med["cold_ttft_s"],
        )
        med["samples"] = results
        rows.append(med)
        print(json.dumps({k: v for k, v in med.items() if k != "samples"}), flush=True)
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    host = platform.processor() or platform.machine()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(f"\nhost {host}, {os.cpu_count()} CPUs, GPU {gpu}, torch {torch.__version__}")
    head = (
        f"{'context':>8} {'reused':>8} {'cold TTFT':>10} {'reuse TTFT':>11} {'ratio':>7}"
        f" {'save s':>7} {'load s':>7} {'restored TTFT':>14} {'ratio':>7} {'MB/1K tok':>10}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['context']:>8} {r['reused_tokens']:>8.0f} {r['cold_ttft_s']:>9.3f}s"
            f" {r['reuse_ttft_s']:>10.4f}s {r['ratio_reuse']:>6.1f}x {r['save_s']:>7.2f}"
            f" {r['load_s']:>7.2f} {r['restored_ttft_s']:>13.4f}s {r['ratio_restored']:>6.1f}x"
            f" {r['mb_per_1k_tokens']:>10.1f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "host": host, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
