"""CPU benchmark on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to fp32):
ours against transformers `generate` on the same weights, the same prompt, in one process.

    python -m bench.cpu_generate [--new-tokens 128] [--json OUT.json]

Measures decode tok/s at batch 1, prefill tok/s for 4096 tokens, and load time
(cold: GGUF conversion included; cached: from the safetensors cache).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

BOOK = (
    Path(__file__).resolve().parents[1].parent
    / "shared"
    / "data"
    / "books"
    / "pride_and_prejudice.txt"
)


def text_tokens(tokenizer, n: int) -> list[int]:
    """n tokens of real prose (the shared novel if present, else the README repeated)."""
    src = BOOK if BOOK.is_file() else Path(__file__).resolve().parents[1] / "README.md"
    text = src.read_text(encoding="utf-8")
    ids = tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def time_load() -> dict:
    from engine import Engine

    with tempfile.TemporaryDirectory() as home:
        old = os.environ.get("AGENTCTX_HOME")
        os.environ["AGENTCTX_HOME"] = home
        try:
            t = time.perf_counter()
            Engine.load(None, device="cpu")
            cold = time.perf_counter() - t
            t = time.perf_counter()
            engine = Engine.load(None, device="cpu")
            cached = time.perf_counter() - t
        finally:
            if old is None:
                os.environ.pop("AGENTCTX_HOME")
            else:
                os.environ["AGENTCTX_HOME"] = old
    del engine
    return {"cold_s": cold, "cached_s": cached}


def bench_ours(engine, decode_prompt, prefill_prompt, new_tokens: int) -> dict:
    from engine import SamplingParams

    engine.generate([decode_prompt[:64]], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    engine.block_manager.reset_prefix_cache()
    c = engine.generate([decode_prompt], SamplingParams(max_tokens=new_tokens, ignore_eos=True))[0]
    engine.block_manager.reset_prefix_cache()
    p = engine.generate([prefill_prompt], SamplingParams(max_tokens=1, ignore_eos=True))[0]
    engine.block_manager.reset_prefix_cache()
    return {
        "decode_tok_s": c.stats.decode_tok_s,
        "prefill_tok_s": len(prefill_prompt) / p.stats.ttft_s,
        "prefill_s": p.stats.ttft_s,
        "tokens": c.token_ids,
    }


def bench_transformers(
    path: Path, decode_prompt, prefill_prompt, new_tokens: int, dtype=torch.float32
) -> dict:
    from transformers import AutoModelForCausalLM

    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    load_s = time.perf_counter() - t

    def gen(ids: list[int], n: int):
        x = torch.tensor([ids])
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                x, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
            )
        return time.perf_counter() - t, out[0, len(ids) :].tolist()

    gen(decode_prompt[:64], 4)  # warm-up
    t1, _ = gen(decode_prompt, 1)
    tn, tokens = gen(decode_prompt, new_tokens)
    tp, _ = gen(prefill_prompt, 1)
    return {
        "decode_tok_s": (new_tokens - 1) / (tn - t1),
        "prefill_tok_s": len(prefill_prompt) / tp,
        "prefill_s": tp,
        "load_cached_s": load_s,
        "tokens": tokens,
    }


def agreement(a: list[int], b: list[int]) -> int:
    """Greedy tokens identical before the first difference."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--decode-context", type=int, default=512)
    ap.add_argument("--prefill-tokens", type=int, default=4096)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from engine import Engine
    from engine.loader import resolve_source

    load = time_load()
    runs = {}
    for label, weights in (("agentctx fp32", "dense"), ("agentctx int4", "int4")):
        engine = Engine.load(None, device="cpu", weights=weights)
        decode_prompt = text_tokens(engine.tokenizer, args.decode_context)
        prefill_prompt = text_tokens(engine.tokenizer, args.prefill_tokens)
        runs[label] = bench_ours(engine, decode_prompt, prefill_prompt, args.new_tokens)
        del engine
    path = resolve_source(None).path
    runs["transformers fp32"] = bench_transformers(
        path, decode_prompt, prefill_prompt, args.new_tokens
    )
    runs["transformers bf16"] = bench_transformers(
        path, decode_prompt, prefill_prompt, args.new_tokens, torch.bfloat16
    )
    peer = runs["transformers fp32"]
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    print(
        f"SmolLM2-135M-Instruct (Q4_1 GGUF), CPU ({machine}); peer: transformers fp32 on the same dequantized weights"
    )
    print(
        f"{'':20s}{'decode tok/s':>13s}{'ratio':>7s}{'prefill tok/s':>15s}{'ratio':>7s}{'same greedy tokens':>20s}"
    )
    for label, r in runs.items():
        same = agreement(r["tokens"], peer["tokens"])
        print(
            f"{label:20s}{r['decode_tok_s']:13.1f}{r['decode_tok_s'] / peer['decode_tok_s']:6.2f}x"
            f"{r['prefill_tok_s']:15.1f}{r['prefill_tok_s'] / peer['prefill_tok_s']:6.2f}x"
            f"{same:>12d}/{args.new_tokens}"
        )
    print(
        f"decode: batch 1, {args.decode_context}-token prompt, {args.new_tokens} new tokens; prefill: {args.prefill_tokens} tokens"
    )
    print(f"load: cold (GGUF -> cache) {load['cold_s']:.2f} s; cached {load['cached_s']:.2f} s "
          f"(transformers from the same cached safetensors: {peer['load_cached_s']:.2f} s)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine, "runs": runs, "load": load}, indent=2)
        )


if __name__ == "__main__":
    main()
