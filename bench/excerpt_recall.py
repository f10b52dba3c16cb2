"""Does packing put the definition a question is about right before it? No model needed.

For each question of the answer evaluation (bench/answer_eval_questions.json), packs its
repository as `ask` does at a given budget and reports where the expected definition ends up:
among the definitions shown again before the question (agentctx.excerpts, and at which
rank), in a file packed in full or truncated, or only in the map. Token counts come from
the model's own tokenizer when --model is given, else from a 3.5-characters-per-token
estimate (said in the output).

python -m bench.excerpt_recall [--model PATH_OR_NAME] [--budget 26000] [--json OUT]
    [--package-dir NAME=PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from agentctx.packing import pack_repository
from bench.answer_eval_questions import build_repo, load

CHARS_PER_TOKEN = 3.5


def _counter(model: str | None):
    if not model:
        return (lambda text: int(len(text) / CHARS_PER_TOKEN) + 1), "estimate (3.5 chars/token)"
    from engine import load_tokenizer

    tokenizer = load_tokenizer(model)
    return (lambda text: len(tokenizer.encode(text))), f"tokenizer of {model}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--budget", type=int, default=26000)
    parser.add_argument("--json")
    parser.add_argument("--package-dir", action="append", default=[], metavar="NAME=PATH")
    args = parser.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.package_dir)
    qs = load()
    count, how = _counter(args.model)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        roots = {n: build_repo(s, Path(tmp), overrides.get(n)) for n, s in qs.repos.items()}
        for q in qs.questions:
            packed = pack_repository(roots[q.repo], qs.prompt(q), count, args.budget)
            answer = q.answers[0]
            rank = next(
                (
                    i + 1
                    for i, e in enumerate(packed.excerpts)
                    if e.path == answer.file
                    and e.name.split(".")[-1] == answer.symbol.split(".")[-1]
                ),
                None,
            )
            files = {f.path: f.packed for f in packed.files}
            rows.append({"id": q.id, "excerpt_rank": rank, "file": files.get(answer.file, "map"),
                         "excerpts": [f"{e.path}:{e.start} {e.name}" for e in packed.excerpts]})  # fmt: skip
    shown = sum(r["excerpt_rank"] is not None for r in rows)
    first = sum(r["excerpt_rank"] == 1 for r in rows)
    print(f"budget {args.budget:,} tokens, counted by {how}; {len(rows)} questions")
    print(f"expected definition among the excerpts: {shown}/{len(rows)} (first: {first})")
    for r in rows:
        print(f"  {r['id']:<12} rank {r['excerpt_rank'] or '-':<3} file {r['file']:<9} "
              f"{'; '.join(r['excerpts'])[:150]}")  # fmt: skip
    if args.json:
        summary = {"budget": args.budget, "counted_by": how, "questions": len(rows),
                   "in_excerpts": shown, "first": first}  # fmt: skip
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
