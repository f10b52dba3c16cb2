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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--book", default="../shared/data/books/pride_and_prejudice.txt")
    ap.add_argument("--json")
    args = ap.parse_args()
    from bench.cpu_spec import run_modes
    from engine import Engine, SamplingParams

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
        runs = run_modes(engine, kind, os.path.abspath(root), question, params,
                         ("off", "lookup", "self", "lookup+self"))  # fmt: skip
        base = runs[0]["decode_tok_s"]
        rows += [{"question": question, "mode": r["mode"], "tokens": r["completion_tokens"],
                  "decode_tok_s": r["decode_tok_s"], "x_off": r["decode_tok_s"] / base,
                  "tokens_per_verification": r["mean_accepted"],
                  "same_tokens": r["same_tokens"]} for r in runs]  # fmt: skip
    for mode in ("lookup", "self", "lookup+self"):
        xs = [r["x_off"] for r in rows if r["mode"] == mode]
        print(f"{mode:>12}: mean {sum(xs) / len(xs):.3f}x no speculation over {len(xs)} questions")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
