"""Tool calls with a real model: how many parse and succeed.

Builds a small git repository in a temporary directory (a shop library of eight modules;
each module's last function holds a fact no other file states) and asks N questions about
those functions with a packing budget too small for their bodies, so that an answer needs
read_file or grep. Each question is one `ask` turn (agentctx.ask.run_turn, greedy, the
tools of the model's template). Reports per question and in total: the tool calls made,
parsed, succeeded and malformed (the usage record's counts), which tools ran, and whether
the answer states the fact.

python -m bench.tool_calls --model PATH_OR_NAME [--weights dense] [-n 8] [--json out.json]
    [--no-tool-prompt]   (without agent.TOOL_PROMPTS, to measure what they change)
    [--nudge-every-step] (agent.NUDGE_EVERY_STEP: ANSWER_OR_CALL after every tool step)
    [--show]             (print every step's raw text)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from agentctx.output import SilentOutput  # (the standard library only)

# (module, the function holding the fact, its body, the question, what the answer must say)
CASES = [
    ("pricing.py", "express_surcharge(weight)", "return weight * 3 + 17",
     "What does express_surcharge in pricing.py return?", ["17"]),
    ("regions.py", "default_region()", 'return "eu-north-7"',
     "What does default_region return?", ["eu-north-7"]),
    ("tokens.py", "token_prefix()", 'return "shp_live_"',
     "What prefix does token_prefix return?", ["shp_live_"]),
    ("archive.py", "archive_suffix()", 'return ".tar.zst"',
     "Which file suffix does archive_suffix in archive.py return?", [".tar.zst"]),
    ("greetings.py", "greeting(name)", 'return f"Ahoy, {name}!"',
     "What greeting text does the greeting function build?", ["Ahoy"]),
    ("units.py", "to_furlongs(meters)", "return meters / 201.168",
     "What number does to_furlongs divide by?", ["201.168"]),
    ("colors.py", "brand_color()", 'return "#3A7BD5"',
     "What colour does brand_color return?", ["3A7BD5"]),
    ("limits.py", "retry_limit()", "return 11  # attempts before giving up",
     "How many attempts does retry_limit allow?", ["11"]),
]  # fmt: skip

FILLER_FUNCTIONS = 8  # short functions before the fact, so the module is over the budget


def module_text(module: str, func: str, body: str) -> str:
    stem = module.removesuffix(".py")
    lines = [f'"""The shop\'s {stem} helpers."""', ""]
    for i in range(FILLER_FUNCTIONS):
        lines += [
            f"def {stem}_helper_{i}(value):",
            f'    """Helper {i} of the {stem} rules."""',
            f"    return value + {i}",
            "",
        ]
    lines += [f"def {func}:", '    """Documented in the shop\'s manual."""', f"    {body}", ""]
    return "\n".join(lines)


def make_repo(root: str) -> None:
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "README.md"), "w") as f:
        f.write("# shop\n\nHelpers for a small web shop, one module per topic.\n")
    for module, func, body, _, _ in CASES:
        with open(os.path.join(root, module), "w") as f:
            f.write(module_text(module, func, body))
    git = ["git", "-C", root, "-c", "user.name=bench", "-c", "user.email=bench@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "shop"], check=True)


class Quiet(SilentOutput):
    """An output that keeps the tool calls and results of a turn."""

    def __init__(self, show: bool) -> None:
        self.show, self.calls = show, []

    def tool_result(self, call):
        self.calls.append((call.label(), call.output.splitlines()[0][:100] if call.output else ""))
        if self.show:
            print(f"    -> {call.label()}\n       {self.calls[-1][1]}")


def ask_one(engine, root, question, args, number):
    from agentctx.ask import TurnLinks, first_messages, pack_for, run_turn
    from engine import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, repetition_penalty=1.1)
    packed = pack_for(engine, root, question, params.max_tokens, args.context_tokens)
    messages = first_messages(packed, question)
    streams, out = [], Quiet(args.show)
    session = engine.open_session(f"bench-tool-calls-{number}")
    start = time.perf_counter()
    try:
        result = run_turn(engine, messages, params, out, root, "repo", args.max_steps,
                          TurnLinks(session, on_stream=streams.append))  # fmt: skip
    finally:
        session.close()
    took = time.perf_counter() - start
    return result, packed, [s.text for s in streams], out.calls, took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--weights", default="auto", choices=["auto", "dense", "int4", "int4-all"])
    ap.add_argument("-n", type=int, default=len(CASES), help="questions to ask (at most 8)")
    ap.add_argument("--context-tokens", type=int, default=150)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--no-tool-prompt", action="store_true")
    ap.add_argument("--nudge-every-step", action="store_true")
    ap.add_argument("--show", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    from agentctx import agent
    from engine import Engine

    if args.no_tool_prompt:
        agent.TOOL_PROMPTS.update(dict.fromkeys(agent.TOOL_PROMPTS, ""))
    agent.NUDGE_EVERY_STEP = args.nudge_every_step
    engine = Engine.load(args.model, device="cpu", weights=args.weights)
    rows, totals = [], dict.fromkeys(("made", "parsed", "succeeded", "malformed", "correct"), 0)
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "shop")
        make_repo(root)
        for number, (_, _, _, question, facts) in enumerate(CASES[: args.n]):
            print(f"Q{number + 1}: {question}", flush=True)
            result, packed, raw, calls, took = ask_one(engine, root, question, args, number)
            u = result.usage
            counts = {k: u.get(f"tool_calls_{k}", 0) for k in ("parsed", "succeeded", "malformed")}
            counts["made"] = u.get("tool_calls", 0)
            correct = all(f.lower() in result.answer.lower() for f in facts)
            in_context = any(f.lower() in packed.text.lower() for f in facts)
            for key in counts:
                totals[key] += counts[key]
            totals["correct"] += correct
            if args.show:
                for i, text in enumerate(raw):
                    print(f"    step {i + 1}: {text!r}")
            print(f"    calls {counts['made']} made, {counts['parsed']} parsed, "
                  f"{counts['succeeded']} succeeded, {counts['malformed']} malformed; "
                  f"answer {'correct' if correct else 'wrong'}; {took:.0f} s"
                  f"{'; (the fact was in the packed context)' if in_context else ''}",
                  flush=True)  # fmt: skip
            rows.append({"question": question, "facts": facts, "answer": result.answer,
                         "finish_reason": result.finish_reason, "correct": correct,
                         "fact_in_context": in_context, "calls": calls, "raw_steps": raw,
                         "seconds": round(took, 1), **counts})  # fmt: skip
    n = len(rows)
    made = totals["made"]
    print(f"\n{n} questions, {args.model} ({args.weights}), tool prompt "
          f"{'off' if args.no_tool_prompt else 'on'}, nudge after "
          f"{'every step' if args.nudge_every_step else 'the last or a looping step'}: "
          f"{made} calls made, "
          f"{totals['parsed']} parsed, {totals['succeeded']} succeeded, "
          f"{totals['malformed']} malformed; questions with a successful call "
          f"{sum(r['succeeded'] > 0 for r in rows)}/{n}; answers correct "
          f"{totals['correct']}/{n}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "totals": totals, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
