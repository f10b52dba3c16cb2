"""CPU benchmark on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to fp32):
ours against transformers `generate` on the same weights, the same prompt, in one process.

    python -m bench.cpu_generate [--new-tokens 128] [--json OUT.json]

Measures decode tok/s at batch 1, prefill tok/s for 4096 tokens, and load time
(cold: GGUF conversion included; cached: from the safetensors cache).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
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
    from engine import Engine, EngineConfig

    with tempfile.TemporaryDirectory() as cache:  # an empty cache: the first load converts
        config = EngineConfig(cache_dir=Path(cache))
        t = time.perf_counter()
        Engine.load(None, device="cpu", config=config)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        engine = Engine.load(None, device="cpu", config=config)
        cached = time.perf_counter() - t
    del engine
    return {"cold_s": cold, "cached_s": cached}


class Ours:
    def __init__(self, weights: str):
        from engine import Engine

        self.engine = Engine.load(None, device="cpu", weights=weights)

    def decode(self, prompt: list[int], n: int) -> tuple[float, list[int]]:
        from engine import SamplingParams

        self.engine.block_manager.reset_prefix_cache()  # every run prefills cold
        c = self.engine.generate([prompt], SamplingParams(max_tokens=n, ignore_eos=True))[0]
        return c.stats.decode_tok_s, c.token_ids

    def prefill(self, prompt: list[int]) -> float:
        from engine import SamplingParams

        self.engine.block_manager.reset_prefix_cache()
        c = self.engine.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))[0]
        return len(prompt) / c.stats.ttft_s


class Transformers:
    def __init__(self, path: Path, dtype: torch.dtype):
        from transformers import AutoModelForCausalLM

        t = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        self.load_s = time.perf_counter() - t

    def _gen(self, ids: list[int], n: int) -> tuple[float, list[int]]:
        x = torch.tensor([ids])
        t = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(
                x, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
            )
        return time.perf_counter() - t, out[0, len(ids) :].tolist()

    def decode(self, prompt: list[int], n: int) -> tuple[float, list[int]]:
        t1, _ = self._gen(prompt, 1)  # prefill and first token, subtracted below
        tn, tokens = self._gen(prompt, n)
        return (n - 1) / (tn - t1), tokens

    def prefill(self, prompt: list[int]) -> float:
        return len(prompt) / self._gen(prompt, 1)[0]


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
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from engine.loading.loader import resolve_source

    load = time_load()
    path = resolve_source(None).path
    contenders = {
        "agentctx fp32": Ours("dense"),
        "agentctx int4": Ours("int4"),
        "transformers fp32": Transformers(path, torch.float32),
        "transformers bf16": Transformers(path, torch.bfloat16),
    }
    tokenizer = contenders["agentctx fp32"].engine.tokenizer
    decode_prompt = text_tokens(tokenizer, args.decode_context)
    prefill_prompt = text_tokens(tokenizer, args.prefill_tokens)
    for c in contenders.values():
        c.decode(decode_prompt[:64], 4)  # warm-up
    samples: dict[str, dict[str, list[float]]] = {
        k: {"decode": [], "prefill": []} for k in contenders
    }
    tokens: dict[str, list[int]] = {}
    # rounds interleave the contenders, so a slow spell of this shared machine hits them all
    for _ in range(args.rounds):
        for name, c in contenders.items():
            rate, tokens[name] = c.decode(decode_prompt, args.new_tokens)
            samples[name]["decode"].append(rate)
            samples[name]["prefill"].append(c.prefill(prefill_prompt))
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in samples.items()}
    peer = med["transformers fp32"]
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    print(
        f"SmolLM2-135M-Instruct (Q4_1 GGUF), CPU ({machine}); medians of {args.rounds} interleaved rounds"
    )
    print(
        f"{'':20s}{'decode tok/s':>13s}{'ratio':>7s}{'prefill tok/s':>15s}{'ratio':>7s}{'same greedy tokens':>20s}"
    )
    for name, m in med.items():
        same = agreement(tokens[name], tokens["transformers fp32"])
        spread = "/".join(f"{x:.1f}" for x in samples[name]["decode"])
        print(
            f"{name:20s}{m['decode']:13.1f}{m['decode'] / peer['decode']:6.2f}x"
            f"{m['prefill']:15.1f}{m['prefill'] / peer['prefill']:6.2f}x{same:>12d}/{args.new_tokens}"
            f"   decode runs {spread}"
        )
    print(
        f"decode: batch 1, {args.decode_context}-token prompt, {args.new_tokens} new tokens; prefill: {args.prefill_tokens} tokens"
    )
    print(
        f"load: cold (GGUF -> cache) {load['cold_s']:.2f} s; cached {load['cached_s']:.2f} s "
        f"(transformers from the same cached safetensors: {contenders['transformers fp32'].load_s:.2f} s)"
    )
    if args.json:
        out = {
            "machine": machine,
            "samples": samples,
            "median": med,
            "load": load,
            "tokens": tokens,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
