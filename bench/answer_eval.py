"""A graded answer evaluation: questions with known answers over real repositories, each
answered through `agentctx ask`'s own path (pack_for and first_messages via
new_session_messages, then run_turn with the embedded engine and the repository tools), and
graded automatically (bench.answer_grade): the right file and symbol, and citations that
resolve.

One engine is loaded per model and weights mode and kept for all its questions, which run
repository by repository, so the engine's prefix cache reuses the packed prefix they share.

python -m bench.answer_eval --model PATH_OR_NAME [--model ...] [--weights auto] \
    [--context-tokens N] [--limit N] [--repo NAME] [--only ID,ID] [--json PATH] [--md PATH] \
    [--package-dir NAME=PATH]  # a repository's sources from PATH (checked, version not looked up)
python -m bench.answer_eval --check      # only check the question set against its packages
python -m bench.answer_eval --regrade R.json --json R.json --md R.md   # grade stored answers again
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from bench.answer_eval_questions import QuestionSetError, build_repo, check, load
from bench.answer_eval_report import hardware, markdown, summarize
from bench.answer_grade import Expected, RepoIndex, grade

DEFAULT_MAX_TOKENS = 256  # the answers asked for are a sentence or two; `ask` allows 400


class Recorder:
    """An `ask` output (agentctx.output's interface) that keeps what a turn emitted and
    prints coarse progress to stderr."""

    def __init__(self, label: str, progress_every: int = 2048) -> None:
        self.label, self.every = label, progress_every
        self.info_lines: list[str] = []
        self.tool_events: list[dict] = []
        self.shown = 0
        self.usage: dict | None = None

    def info(self, line: str) -> None:
        self.info_lines.append(line)

    def prefill(self, done: int, total: int) -> None:
        if done >= total or done - self.shown >= self.every:
            self.shown = done
            _log(f"  {self.label}: prefill {done:,}/{total:,}")

    def text(self, delta: str) -> None:
        pass  # the answer is the turn's result

    def tool_call(self, call) -> None:
        _log(f"  {self.label}: -> {call.label()[:120]}")

    def tool_result(self, call) -> None:
        self.tool_events.append({"name": call.name, "error": call.error})

    def end(self, usage: dict) -> None:
        self.usage = usage


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def expected_in_context(packed, path: str) -> str:
    """How the expected file went into the prompt: full, or the packing's reason if not."""
    reasons = {o.path: o.reason for o in packed.omitted}
    if path in reasons:
        return reasons[path]  # "truncated" (also packed), "budget", ...
    return "full" if any(f.path == path for f in packed.files) else "absent"


def run_question(
    engine, root: str, q, prompt, params, context_tokens, max_steps, index, check=True
) -> dict:
    """One question (asked as `prompt`) through the product path; the answer graded (and,
    where the answer check asked again, the first answer too)."""
    from agentctx.ask import TurnLinks, new_session_messages, open_engine_session, run_turn

    out = Recorder(q.id)
    record: dict = {"id": q.id, "repo": q.repo, "question": prompt}
    start = time.perf_counter()
    es = None
    try:
        messages, packed = new_session_messages(
            engine, root, prompt, params, context_tokens, out, "repo"
        )
        es = open_engine_session(engine, None, out)
        result = run_turn(
            engine, messages, params, out, root, "repo", max_steps, TurnLinks(es, check=check)
        )
    except Exception as e:  # noqa: BLE001 (an engine or tool failure is this question's result)
        record.update(error=f"{type(e).__name__}: {e}", wall_s=time.perf_counter() - start)
        return record
    finally:
        if es is not None:
            es.close()
    wall = time.perf_counter() - start
    calls = [
        {"name": c.name, "arguments": c.arguments, "ok": c.error is None, "error": c.error}
        for step in result.steps
        for c in step.calls
    ]
    record.update(answer=result.answer, finish_reason=result.finish_reason)
    if "answer_check" in result.usage:  # the answer that the check sent back
        first = next(s for s in result.steps if not s.calls and s.after)
        record["checked"] = {"faults": result.usage["answer_check"], "first_answer": first.content,
                             "kept_first": result.usage["answer_check_kept_first"]}  # fmt: skip
    grade_record(record, q, index, root)
    record.update(
        tool_calls=calls,
        usage=result.usage,
        packing=out.info_lines[0] if out.info_lines else "",
        expected_file=[expected_in_context(packed, a.file) for a in q.answers],
        wall_s=round(wall, 2),
    )
    return record


def grade_record(record: dict, q, index: RepoIndex, root: str, regrading: bool = False) -> None:
    """Grade the record's answer twice: as the model wrote it ("grade"), and as `ask` shows
    it, with the references it lists under the answer (agentctx.references: names and
    citations resolved from the files; "grade_with_references"). Citations are counted from
    the model's text only: the references' own are right by construction. A record stored
    without its references (an older run) gets this checkout's, and says so."""
    from agentctx.references import for_answer, render

    if "references" not in record:
        record["references"] = render(for_answer(record["answer"], root))
        if regrading:
            record["references_at_regrade"] = True
    expected = [Expected(a.file, a.symbol) for a in q.answers]
    text = grade(record["answer"], expected, index, q.facts)
    shown = grade(f"{record['answer']}\n\n{record['references']}", expected, index, q.facts)
    shown.citations = text.citations
    record["grade"], record["grade_with_references"] = text.to_dict(), shown.to_dict()
    checked = record.get("checked")
    if checked:  # the first answer as `ask --no-check` would have shown it
        first = checked["first_answer"]
        refs = render(for_answer(first, root))
        before = grade(f"{first}\n\n{refs}", expected, index, q.facts)
        before.citations = grade(first, expected, index, q.facts).citations
        checked["grade_with_references"] = before.to_dict()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.answer_eval", description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument(
        "--model", action="append", help="as `ask --model` (repeatable; default: default)"
    )
    ap.add_argument("--weights", action="append", choices=["auto", "dense", "int4", "int4-all"],
                    help="weights modes to run each model in (repeatable; default auto)")  # fmt: skip
    ap.add_argument("--device", default="auto")
    ap.add_argument("--context-tokens", type=int, default=None, help="cap on packed tokens")
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    ap.add_argument("--max-steps", type=int, default=None, help="tool steps (default: ask's)")
    ap.add_argument("--speculate", default="auto", help="as `ask --speculate`")
    ap.add_argument("--excerpts", type=int, default=None,
                    help="definitions shown again before the question (default: packing's "
                    "agentctx.excerpts.MAX_EXCERPTS; 0: none, an ablation)")  # fmt: skip
    ap.add_argument("--no-answer-check", dest="answer_check", action="store_false",
                    help="keep every first answer (as `ask --no-check`; an ablation)")  # fmt: skip
    ap.add_argument("--repo", action="append", help="only these repositories (repeatable)")
    ap.add_argument("--only", default=None, help="only these question ids, comma-separated")
    ap.add_argument("--limit", type=int, default=None, help="the first N questions selected")
    ap.add_argument("--questions", default=None, help="a question set (default: bench's)")
    ap.add_argument("--json", dest="json_path", default=None, help="write results as JSON")
    ap.add_argument("--md", dest="md_path", default=None, help="write the tables as markdown")
    ap.add_argument("--check", action="store_true", help="check the question set and exit")
    ap.add_argument("--regrade", metavar="JSON", help="grade a run's stored answers again")
    ap.add_argument("--resume", action="store_true",
                    help="keep the --json file's graded answers and ask only the rest")  # fmt: skip
    ap.add_argument("--package-dir", action="append", default=[], metavar="NAME=PATH",
                    help="take repository NAME's package sources from PATH instead of the "
                    "installed package (no version lookup; the expected lines are still "
                    "checked); repeatable")  # fmt: skip
    args = ap.parse_args(argv)
    args.package_dirs = {}
    for item in args.package_dir:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            ap.error(f"--package-dir {item!r}: use NAME=PATH")
        if name in args.package_dirs:
            ap.error(f"--package-dir {name} is given twice")
        args.package_dirs[name] = path
    if args.resume and not args.json_path:
        ap.error("--resume needs --json PATH (the results to continue)")
    for name in ("context_tokens", "max_tokens", "limit", "max_steps", "excerpts"):
        value, least = getattr(args, name), 0 if name in ("max_steps", "excerpts") else 1
        if value is not None and value < least:
            ap.error(f"--{name.replace('_', '-')} must be at least {least}")
    if args.excerpts is not None:
        import agentctx.excerpts

        agentctx.excerpts.MAX_EXCERPTS = args.excerpts  # this process only: an ablation
    return args


def select(qs, args) -> list:
    chosen = qs.questions
    if args.repo:
        unknown = set(args.repo) - set(qs.repos)
        if unknown:
            raise QuestionSetError(f"unknown repository: {', '.join(sorted(unknown))}")
        chosen = [q for q in chosen if q.repo in args.repo]
    if args.only:
        ids = [i.strip() for i in args.only.split(",") if i.strip()]
        missing = set(ids) - {q.id for q in chosen}
        if missing:
            raise QuestionSetError(f"no such question: {', '.join(sorted(missing))}")
        chosen = [q for q in chosen if q.id in ids]
    chosen = sorted(chosen, key=lambda q: list(qs.repos).index(q.repo))  # (stable)
    return chosen[: args.limit] if args.limit else chosen


def evaluate(args, qs, questions, roots: dict[str, Path], meta: dict) -> list[dict]:
    from agentctx.agent import DEFAULT_MAX_STEPS
    from agentctx.engine_options import engine_config
    from engine import Engine, SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, repetition_penalty=1.1)
    max_steps = DEFAULT_MAX_STEPS if args.max_steps is None else args.max_steps
    indexes = {name: RepoIndex(root) for name, root in roots.items()}
    order = {q.id: i for i, q in enumerate(qs.questions)}
    runs: list[dict] = meta.pop("_runs", [])  # a resumed file's runs
    for model in args.model or ["default"]:
        for weights in args.weights or ["auto"]:
            run = next((r for r in runs if (r["model"], r["weights"]) == (model, weights)), None)
            done = {r["id"] for r in run["records"] if "grade" in r} if run else set()
            todo = [q for q in questions if q.id not in done]
            if not todo:
                continue
            _log(f"loading {model} (weights {weights})...")
            config = engine_config(None, None, None, "off", args.speculate, "timed")
            start = time.perf_counter()
            engine = Engine.load(model, device=args.device, weights=weights, config=config)
            load_s = round(time.perf_counter() - start, 1)
            dtype = str(engine.dtype).removeprefix("torch.")
            _log(f"loaded {engine.name} in {load_s} s (conversion included if not cached): "
                 f"weights {engine.weights_mode}, {dtype} on {engine.device}")  # fmt: skip
            if run is None:
                run = {"model": model, "weights": weights, "records": []}
                runs.append(run)
            run.update(engine=engine.name, weights_mode=engine.weights_mode, hardware=hardware(),
                       device=str(engine.device), dtype=dtype, load_s=load_s,
                       max_model_len=engine.max_model_len,
                       records=[r for r in run["records"] if "grade" in r],
                       repo_tokens={n: _repo_tokens(engine, indexes[n]) for n in roots})  # fmt: skip
            for i, q in enumerate(todo, 1):
                r = run_question(engine, str(roots[q.repo]), q, qs.prompt(q), params,
                                 args.context_tokens, max_steps, indexes[q.repo],
                                 args.answer_check)  # fmt: skip
                run["records"] = sorted([*run["records"], r], key=lambda r: order[r["id"]])
                run["summary"] = summarize(run["records"])
                _log(f"[{i}/{len(todo)}] {q.id}: " + _brief(r))
                write_outputs(args, runs, meta)  # a long run's results survive its end
            del engine
    for run in runs:
        run["summary"] = summarize(run["records"])
    return runs


def _repo_tokens(engine, index: RepoIndex) -> int:
    return sum(engine.count_tokens("\n".join(index.lines(f))) for f in index.files)


def _brief(r: dict) -> str:
    if "grade" not in r:
        return f"error: {r['error']} ({r['wall_s']:.0f} s)"
    g, calls = r["grade"], r["tool_calls"]
    return (
        f"{'correct' if g['correct'] else 'wrong'}, citations {g['citations_resolved']}"
        f"/{len(g['citations'])}, tools {sum(c['ok'] for c in calls)}/{len(calls)}, "
        f"{r['wall_s']:.0f} s"
    )


def write_outputs(args, runs: list[dict], meta: dict) -> None:
    """Both files replaced whole (a run killed while writing leaves the previous ones)."""
    if args.json_path:
        data = {"meta": meta, "runs": runs}
        _replace(Path(args.json_path), json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    if args.md_path:
        _replace(Path(args.md_path), markdown(runs, meta))


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        qs = load(args.questions) if args.questions else load()
        questions = select(qs, args)
        stored = _read_results(args.regrade) if args.regrade else None
        overrides = args.package_dirs
        unknown = sorted(set(overrides) - set(qs.repos))
        if unknown:
            raise QuestionSetError(f"--package-dir: unknown repository: {', '.join(unknown)}")
        with tempfile.TemporaryDirectory(prefix="answer-eval-") as tmp:
            whole = args.check or stored is not None
            needed = list(qs.repos) if whole else sorted({q.repo for q in questions})
            roots = {name: build_repo(qs.repos[name], Path(tmp), overrides.get(name))
                     for name in needed}  # fmt: skip
            check(qs if whole else _subset(qs, questions), roots)
            if args.check:
                print(f"{len(qs.questions)} questions over {len(roots)} repositories: all "
                      "expected files and symbols are where the set says")  # fmt: skip
                return 0
            command = "python -m bench.answer_eval " + shlex.join(
                sys.argv[1:] if argv is None else argv
            )
            if stored is not None:
                meta, runs = stored["meta"], regrade(stored["runs"], qs, roots)
                meta["regraded_by"] = command
                _note_package_dirs(meta, overrides)
            elif args.resume and Path(args.json_path).exists():
                data = _read_results(args.json_path)
                meta = {**data["meta"], "_runs": data["runs"]}
                meta.setdefault("resumed_by", []).append(command)
                _note_package_dirs(meta, overrides)
                runs = evaluate(args, qs, questions, roots, meta)
            else:
                meta = {"command": command, "hardware": hardware(), "questions": len(questions),
                        "repos": {n: qs.repos[n].about for n in needed}}  # fmt: skip
                _note_package_dirs(meta, overrides)
                runs = evaluate(args, qs, questions, roots, meta)
    except QuestionSetError as e:
        print(f"answer_eval: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        from engine import EngineError

        if not isinstance(e, EngineError):
            raise
        print(f"answer_eval: error: {e}", file=sys.stderr)
        return 1
    write_outputs(args, runs, meta)
    print(markdown(runs, meta), end="")
    return 0


def _note_package_dirs(meta: dict, overrides: dict[str, str]) -> None:
    """Record in the run's meta which repositories' sources came from --package-dir."""
    if overrides:
        meta["package_dirs"] = {**meta.get("package_dirs", {}), **overrides}


def _read_results(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data.get("runs"), list) or "meta" not in data:
            raise ValueError("no runs and meta")
    except (OSError, ValueError, AttributeError) as e:
        raise QuestionSetError(f"--regrade {path}: not this evaluation's JSON ({e})") from None
    return data


def regrade(runs: list[dict], qs, roots: dict[str, Path]) -> list[dict]:
    """The stored answers graded again with this checkout's grader (no model runs)."""
    by_id = {q.id: q for q in qs.questions}
    indexes = {name: RepoIndex(root) for name, root in roots.items()}
    for run in runs:
        for r in run["records"]:
            q = by_id.get(r["id"])
            if q is None:
                raise QuestionSetError(f"--regrade: question {r['id']} is not in the set")
            if "answer" in r:
                grade_record(r, q, indexes[q.repo], str(roots[q.repo]), regrading=True)
        run["summary"] = summarize(run["records"])
    return runs


def _subset(qs, questions):
    from bench.answer_eval_questions import QuestionSet

    return QuestionSet(qs.repos, list(questions))


if __name__ == "__main__":
    sys.exit(main())
