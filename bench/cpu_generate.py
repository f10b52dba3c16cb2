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


def bench_transformers(path: Path, decode_prompt, prefill_prompt, new_tokens: int) -> dict:
    from transformers import AutoModelForCausalLM

    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
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
    engine = Engine.load(None, device="cpu")
    decode_prompt = text_tokens(engine.tokenizer, args.decode_context)
    prefill_prompt = text_tokens(engine.tokenizer, args.prefill_tokens)
    ours = bench_ours(engine, decode_prompt, prefill_prompt, args.new_tokens)
    del engine
    hf = bench_transformers(
        resolve_source(None).path, decode_prompt, prefill_prompt, args.new_tokens
    )
    same = ours["tokens"] == hf["tokens"]
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "ours": ours, "transformers": hf, "load": load, "greedy_tokens_identical": same,
    }  # fmt: skip
    print(f"SmolLM2-135M-Instruct fp32, CPU ({result['machine']})")
    print(f"{'':34s}{'agentctx':>10s}{'transformers':>14s}{'ratio':>8s}")
    for label, key in ((f"decode tok/s (batch 1, ctx {args.decode_context})", "decode_tok_s"),
                       (f"prefill tok/s ({args.prefill_tokens} tokens)", "prefill_tok_s")):  # fmt: skip
        print(f"{label:34s}{ours[key]:10.1f}{hf[key]:14.1f}{ours[key] / hf[key]:7.2f}x")
    print(f"{'load, cold (GGUF -> cache) s':34s}{load['cold_s']:10.2f}")
    print(f"{'load, cached s':34s}{load['cached_s']:10.2f}{hf['load_cached_s']:14.2f}")
    print(f"greedy tokens identical over {args.new_tokens} tokens: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
