"""Speculative decoding with a real model: decode tok/s and tokens per verification for each
proposer against no speculation, on a code question over a packed repository and a quotation
question over a book (the app's own packing and prompts). The default model on the CPU by
default; any model and device with --model, --device, --dtype (the H200: bash bench/gpu.sh
real-model), and a smaller model of the same tokenizer as the draft with --draft.

python -m bench.cpu_spec [--repo .] [--book ../shared/data/books/pride_and_prejudice.txt] \
    [--weights auto] [--max-tokens 128] [--modes off lookup self draft] [--json out.json] \
    [--model M.gguf] [--draft D.gguf] [--device cuda] [--dtype bfloat16]

One engine serves every mode; the prefix cache is emptied before each run, so every mode
prefills the same way (with the 4-bit weights, a prompt partly taken from the cache can
decode differently from a cold one: its tail is prefilled in another chunking). Greedy
with the CLI's repetition penalty (1.1): every mode must emit the same tokens (checked). `draft` uses the default model itself as the
draft (the only model on the machine): it shows the machinery, not a useful pairing.
"""

from __future__ import annotations

import argparse
import json
import os


class _Quiet:
    def info(self, *_):
        pass


def run_modes(engine, kind: str, root: str, question: str, params, modes,
              draft: str | None = None) -> list[dict]:  # fmt: skip
    """One question over the app's packing of `root` (a repo or a book), decoded once per
    speculation mode ("off" first: the reference tokens), the prefix cache emptied before
    each run; a row per mode, printed as it comes."""
    from agentctx.ask import new_session_messages
    from engine.loading.default_model import default_model_path
    from engine.spec.decoder import SpecConfig, SpecDecoder, make_proposer

    messages, _ = new_session_messages(engine, root, question, params, None, _Quiet(), kind)
    prompt = engine.chat_tokens(messages)
    reference = None
    rows = []
    for mode in modes:
        name = f"draft:{draft or default_model_path()}" if mode == "draft" else mode
        cfg = SpecConfig(name)
        engine.spec = (
            None
            if mode == "off"
            else SpecDecoder(
                engine.runner,
                engine.block_manager,
                cfg,
                make_proposer(cfg, engine.runner, engine.config.cache_dir),
            )
        )
        engine.block_manager.reset_prefix_cache()
        c = engine.generate([prompt], params)[0]
        if reference is None:
            reference = c.token_ids
        spec = c.stats.speculation
        row = {"case": kind, "question": question, "mode": mode, "prompt_tokens": len(prompt),
               "completion_tokens": len(c.token_ids), "decode_tok_s": c.stats.decode_tok_s,
               "same_tokens": c.token_ids == reference,
               "mean_accepted": spec.mean_accepted if spec else None,
               "acceptance_rate": spec.acceptance_rate if spec else None,
               "verifications": spec.steps if spec else 0,
               "proposer_share": spec.propose_s / c.stats.total_s if spec else 0.0,
               "drafted": spec.drafted if spec else 0,
               # seconds per step by query positions (1: a plain step), as measured by
               # the draft-length policy during the run
               "step_ms": {T: 1000 * t for T, t in sorted(engine.spec.lengths.step_s.items())}
               if engine.spec else {}}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=".")
    ap.add_argument("--book", default="../shared/data/books/pride_and_prejudice.txt")
    ap.add_argument("--weights", default="auto", choices=["auto", "dense", "int4", "int4-all"])
    ap.add_argument("--model", default=None, help="default: the default model")
    ap.add_argument(
        "--draft", default=None, help="the draft mode's model (default: the default model)"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--modes", nargs="+", default=["off", "lookup", "self", "draft"])
    ap.add_argument("--json")
    args = ap.parse_args()
    from engine import Engine, SamplingParams

    engine = Engine.load(args.model, device=args.device, dtype=args.dtype, weights=args.weights)
    params = SamplingParams(max_tokens=args.max_tokens, repetition_penalty=1.1)
    cases = [("repo", os.path.abspath(args.repo),
              "Show the source code of the function accept_greedy in engine/spec/accept.py.")]  # fmt: skip
    if os.path.exists(args.book):
        cases.append(("book", os.path.abspath(args.book),
                      "Quote the first three sentences of Chapter 1 exactly."))  # fmt: skip
    rows = []
    for kind, root, question in cases:
        rows += run_modes(engine, kind, root, question, params, args.modes, args.draft)
    print(f"\n{'case':>5} {'mode':>7} {'prompt':>7} {'tok/s':>7} {'x off':>6} {'tok/verif':>9} "
          f"{'accepted':>8} {'proposer':>8} same")  # fmt: skip
    for r in rows:
        base = next(b for b in rows if b["case"] == r["case"] and b["mode"] == "off")
        ma = f"{r['mean_accepted']:9.2f}" if r["mean_accepted"] else f"{'-':>9}"
        ar = f"{r['acceptance_rate']:8.0%}" if r["acceptance_rate"] is not None else f"{'-':>8}"
        print(f"{r['case']:>5} {r['mode']:>7} {r['prompt_tokens']:7d} {r['decode_tok_s']:7.1f} "
              f"{r['decode_tok_s'] / base['decode_tok_s']:6.2f} {ma} {ar} "
              f"{r['proposer_share']:8.0%} {r['same_tokens']}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": engine.name, "draft": args.draft, "device": str(engine.device),
                       "dtype": str(engine.dtype), "weights": engine.weights_mode,
                       "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
