"""The answer evaluation's report: per run a summary of its graded records, the markdown
tables, and the machine it ran on."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess


def summarize(records: list[dict]) -> dict:
    graded = [r for r in records if "grade" in r]
    cites = [c for r in graded for c in r["grade"]["citations"]]
    calls = [c for r in graded for c in r["tool_calls"]]
    ttft = [r["usage"]["ttft_s"] for r in graded if r["usage"].get("ttft_s") is not None]
    decode = [r["usage"]["decode_tok_s"] for r in graded if r["usage"].get("decode_tok_s")]
    checked = [r for r in graded if "grade_with_references" in r.get("checked", {})]
    n = len(records)
    return {
        "questions": n,
        "errors": n - len(graded),
        "correct": sum(r["grade"]["correct"] for r in graded),
        # as `ask` shows the answer: the model's text and the references under it
        "correct_with_references": sum(_shown(r)["correct"] for r in graded),
        "file_named_with_references": sum(_shown(r)["file_ok"] for r in graded),
        "symbol_named_with_references": sum(_shown(r)["symbol_ok"] for r in graded),
        "file_named": sum(r["grade"]["file_ok"] for r in graded),
        "symbol_named": sum(r["grade"]["symbol_ok"] for r in graded),
        "citations": len(cites),
        "citations_resolved": sum(c["resolved"] for c in cites),
        "citations_unchecked": sum(c["why"] == "unchecked" for c in cites),
        "tool_calls": len(calls),
        "tool_calls_ok": sum(c["ok"] for c in calls),
        "questions_with_tools": sum(bool(r["tool_calls"]) for r in graded),
        # calls the product's parser found malformed (its usage counts them; absent: 0)
        "tool_calls_malformed": sum(r["usage"].get("tool_calls_malformed", 0) for r in graded),
        "expected_file_in_full": sum("full" in r["expected_file"] for r in graded),
        # answers the files contradicted, asked again once (agentctx.answer_check): how many,
        # and how many of them were correct as shown before and after
        "answers_checked": len(checked),
        "checked_correct_before": sum(
            r["checked"]["grade_with_references"]["correct"] for r in checked
        ),  # fmt: skip
        "checked_correct_after": sum(_shown(r)["correct"] for r in checked),
        "ttft_s_mean": round(statistics.mean(ttft), 2) if ttft else None,
        "decode_tok_s_median": round(statistics.median(decode), 2) if decode else None,
        "wall_s": round(sum(r["wall_s"] for r in records), 1),
    }


def _shown(record: dict) -> dict:
    return record.get("grade_with_references", record["grade"])


def _pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / whole:.0%})" if whole else "0/0"


def markdown(runs: list[dict], meta: dict) -> str:
    lines = [
        "| model | weights | correct, as shown (with references) | correct, the model's text "
        "| file named (text / shown) | symbol named (text / shown) | citations resolve "
        "| tool calls ok/made (questions using tools) | expected file packed in full "
        "| answers checked (correct before -> after) "
        "| TTFT mean (s) | decode tok/s (median) | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        n = s["questions"]
        lines.append(
            f"| {run['model']} | {run['weights_mode']} "
            f"| {_pct(s['correct_with_references'], n)} | {_pct(s['correct'], n)} "
            f"| {s['file_named']} / {s['file_named_with_references']} "
            f"| {s['symbol_named']} / {s['symbol_named_with_references']} "
            f"| {_pct(s['citations_resolved'], s['citations'])}"
            f" ({s['citations_unchecked']} unchecked) "
            f"| {s['tool_calls_ok']}/{s['tool_calls']} ({s['questions_with_tools']}) "
            f"| {_pct(s['expected_file_in_full'], n)} "
            f"| {s.get('answers_checked', 0)} ({s.get('checked_correct_before', 0)} -> "
            f"{s.get('checked_correct_after', 0)}) | {s['ttft_s_mean']} "
            f"| {s['decode_tok_s_median']} | {s['wall_s']} |"
        )
    for run in runs:
        lines += ["", f"{run['model']} ({run['weights_mode']}), per question:", ""]
        lines += [
            "| question | correct (shown / text) | file | symbol | fact | citations ok "
            "| tools ok/made | expected file | prompt tokens (reused) | TTFT (s) | answer |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in run["records"]:
            lines.append(_question_row(r))
    for run in runs[:1]:
        sizes = ", ".join(f"{name} {n:,}" for name, n in run.get("repo_tokens", {}).items())
        lines += ["", f"Repository sizes in {run['model']}'s tokens: {sizes}."] if sizes else []
    lines += ["", f"Command: `{meta['command']}`", ""]
    return "\n".join(lines) + "\n"


def _question_row(r: dict) -> str:
    if "grade" not in r:
        return f"| {r['id']} | error | | | | | | | | | {_cell(r['error'])} |"
    g, u = r["grade"], r["usage"]
    yes = lambda v: "yes" if v else "no"
    cites = sum(c["resolved"] for c in g["citations"])
    ok = sum(c["ok"] for c in r["tool_calls"])
    return (
        f"| {r['id']} | {yes(_shown(r)['correct'])} / {yes(g['correct'])} "
        f"| {yes(g['file_ok'])} | {yes(g['symbol_ok'])} "
        f"| {yes(g['fact_ok'])} | {cites}/{len(g['citations'])} | {ok}/{len(r['tool_calls'])} "
        f"| {'/'.join(r['expected_file'])} | {u.get('prompt_tokens')} ({u.get('cached_tokens')}) "
        f"| {u.get('ttft_s')} | {_cell(r['answer'])} |"
    )


def _cell(text: str, width: int = 90) -> str:
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def hardware() -> dict:
    info = {"nproc": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "load_average": os.getloadavg()}  # fmt: skip
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        info["lscpu"] = lscpu.splitlines()[:12]
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        import torch

        info["torch"], info["torch_threads"] = torch.__version__, torch.get_num_threads()
    except ImportError:
        pass
    return info
