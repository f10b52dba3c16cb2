"""CPU speculation, the four proposer choices of `--speculate` on five questions (three over
this repository's packed files, two over a book), default model, 4-bit weights, greedy with
the CLI's repetition penalty, 128 new tokens at most; the prefix cache emptied before each
run, every mode checked token-identical to no speculation. How `auto` was chosen
(docs/benchmarks.md).

python -m bench.cpu_spec_modes [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os


class _Quiet:
    def info(self, *_):
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--book", default="../shared/data/books/pride_and_prejudice.txt")
    ap.add_argument("--json")
    args = ap.parse_args()
    from agentctx.ask import new_session_messages
    from engine import Engine, SamplingParams
    from engine.spec.decoder import SpecConfig, SpecDecoder, make_proposer

    engine = Engine.load(None, device="cpu")
    params = SamplingParams(max_tokens=128, repetition_penalty=1.1)
    book = args.book
    cases = [
        ("repo", ".", "Show the source code of the function accept_greedy in engine/spec/accept.py."),
        ("book", book, "Quote the first three sentences of Chapter 1 exactly."),
        ("repo", ".", "Explain how the scheduler decides which requests run in a step."),
        ("repo", ".", "What does the --speculate option do?"),
        ("book", book, "Who is Mr. Darcy, and how does Elizabeth first see him?"),
    ]  # fmt: skip
    rows = []
    for kind, root, question in cases:
        if not os.path.exists(root):
            continue
        messages, _ = new_session_messages(engine, os.path.abspath(root), question, params,
                                           None, _Quiet(), kind)  # fmt: skip
        prompt = engine.chat_tokens(messages)
        base = ref = None
        for mode in ("off", "lookup", "self", "lookup+self"):
            cfg = SpecConfig(mode)
            engine.spec = (
                None if mode == "off" else SpecDecoder(engine, cfg, make_proposer(cfg, engine))
            )
            engine.block_manager.reset_prefix_cache()
            c = engine.generate([prompt], params)[0]
            spec = c.stats.speculation
            base = base or c.stats.decode_tok_s
            ref = ref or c.token_ids
            row = {"question": question, "mode": mode, "tokens": len(c.token_ids),
                   "decode_tok_s": c.stats.decode_tok_s, "x_off": c.stats.decode_tok_s / base,
                   "tokens_per_verification": spec.mean_accepted if spec else None,
                   "same_tokens": c.token_ids == ref}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    for mode in ("lookup", "self", "lookup+self"):
        xs = [r["x_off"] for r in rows if r["mode"] == mode]
        print(f"{mode:>12}: mean {sum(xs) / len(xs):.3f}x no speculation over {len(xs)} questions")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
