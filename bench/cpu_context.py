"""CPU decode and prefill speed against context length, default model, int4 and fp32.

python -m bench.cpu_context [--contexts 512 4096 7500] [--new-tokens 48]
"""

from __future__ import annotations

import argparse

from bench.cpu_generate import text_tokens


def main() -> None:
    from engine import Engine, SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 7500])
    ap.add_argument("--new-tokens", type=int, default=48)
    args = ap.parse_args()
    print(f"{'weights':8s}{'context':>9s}{'decode tok/s':>14s}{'prefill tok/s':>15s}")
    for weights in ("int4", "dense"):
        engine = Engine.load(None, device="cpu", weights=weights)
        ids = text_tokens(engine.tokenizer, max(args.contexts))
        for n in args.contexts:
            engine.block_manager.reset_prefix_cache()
            params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
            c = engine.generate([ids[:n]], params)[0]
            print(
                f"{weights:8s}{n:9d}{c.stats.decode_tok_s:14.1f}{c.stats.prefill_tok_s:15.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
