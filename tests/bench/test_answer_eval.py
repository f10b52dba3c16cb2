"""The answer evaluation's question set and harness: the set is checked against the real
packages it asks about, a set that no longer matches fails loudly, and the harness runs a
question through `ask`'s own path with a real model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.answer_eval_questions import (
    QUESTIONS_PATH,
    QuestionSet,
    QuestionSetError,
    RepoSpec,
    build_repo,
    check,
    load,
    package_dir,
)
from bench.answer_eval_report import markdown, summarize

ROOT = Path(__file__).resolve().parents[2]


def run_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.answer_eval", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def edited_set(tmp_path, edit) -> Path:
    data = json.loads(QUESTIONS_PATH.read_text())
    edit(data)
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(data))
    return path


def test_the_set_is_big_enough_and_matches_its_packages(tmp_path):
    qs = load()
    assert len(qs.questions) >= 30 and len(qs.repos) >= 3
    roots = {name: build_repo(spec, tmp_path) for name, spec in qs.repos.items()}
    check(qs, roots)  # raises on any expected file or symbol that moved
    for name, root in roots.items():
        assert subprocess.run(["git", "log", "--oneline"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip(), name  # fmt: skip


def test_moved_lines_missing_symbols_and_files_fail_loudly(tmp_path):
    def rot(data):
        data["questions"][0]["answers"][0]["lines"] = [1, 2]
        data["questions"][1]["answers"][0]["symbol"] = "no_such_function"
        data["questions"][2]["answers"][0]["file"] = "json/gone.py"

    qs = load(edited_set(tmp_path, rot))
    roots = {"json": build_repo(qs.repos["json"], tmp_path)}
    qs.questions = [q for q in qs.questions if q.repo == "json"]
    with pytest.raises(QuestionSetError) as e:
        check(qs, roots)
    message = str(e.value)
    assert "3 problems" in message and "not 1-2" in message
    assert "defines no no_such_function" in message and "json/gone.py is not in json" in message


def test_a_package_of_another_version_is_refused(tmp_path):
    def bump(data):
        data["repos"]["click"]["version"] = "0.0.1"

    qs = load(edited_set(tmp_path, bump))
    with pytest.raises(QuestionSetError, match=r"questions are for click 0\.0\.1, this is "):
        build_repo(qs.repos["click"], tmp_path)


def test_package_dir_takes_a_copy_whose_lines_are_still_checked(tmp_path):
    qs = load()
    good = tmp_path / "good" / "json"
    shutil.copytree(package_dir(qs.repos["json"]), good, ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    spec = RepoSpec("json", "json", "stdlib", "0.0")  # another version: never looked up
    json_qs = QuestionSet({"json": spec}, [q for q in qs.questions if q.repo == "json"])
    root = build_repo(spec, tmp_path / "a", good)
    check(json_qs, {"json": root})
    assert (root / "json" / "decoder.py").read_bytes() == (good / "decoder.py").read_bytes()
    shifted = tmp_path / "shifted" / "json"
    shutil.copytree(good, shifted)
    init = shifted / "__init__.py"
    init.write_text("\n" + init.read_text())  # every line of __init__.py one further down
    with pytest.raises(QuestionSetError, match=r"json-01: detect_encoding is at json/__init__\.py:245-272, not 244-271"):  # fmt: skip
        check(json_qs, {"json": build_repo(spec, tmp_path / "b", shifted)})
    with pytest.raises(QuestionSetError, match="not a package folder"):
        build_repo(spec, tmp_path / "c", tmp_path)
    # on the command line: the override is recorded in the run's meta, a wrong copy refused
    record = {"id": "json-01", "repo": "json", "question": "?", "tool_calls": [], "answer": "",
              "expected_file": ["full"], "usage": {}, "wall_s": 1.0,
              "grade": {"correct": False, "file_ok": False, "symbol_ok": False, "pair_ok": False,
                        "fact_ok": True, "citations": [], "citations_resolved": 0}}  # fmt: skip
    path = tmp_path / "r.json"
    run = {"model": "no-such-model", "weights": "auto", "weights_mode": "dense",
           "records": [record]}  # fmt: skip
    path.write_text(json.dumps({"meta": {"command": "python -m bench.answer_eval"}, "runs": [run]}))
    args = ("--model", "no-such-model", "--only", "json-01", "--json", str(path), "--resume")
    done = run_eval(*args, "--package-dir", f"json={good}")
    assert done.returncode == 0, done.stderr
    assert json.loads(path.read_text())["meta"]["package_dirs"] == {"json": str(good)}
    refused = run_eval(*args, "--package-dir", f"json={shifted}")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "not 244-271" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    unknown = run_eval("--check", "--package-dir", f"nope={good}")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "answer_eval: error: --package-dir: unknown repository: nope"
    assert run_eval("--check", "--package-dir", "json").returncode == 2


def test_command_line_check_and_errors(tmp_path):
    ok = run_eval("--check")
    assert ok.returncode == 0 and "all expected files and symbols" in ok.stdout
    bad = run_eval("--only", "json-01,nope-99")
    assert bad.returncode == 1
    assert bad.stderr.strip() == "answer_eval: error: no such question: nope-99"
    rotten = edited_set(tmp_path, lambda d: d["questions"][0]["answers"][0].update(lines=[5, 6]))
    loud = run_eval("--check", "--questions", str(rotten))
    assert loud.returncode == 1 and "Traceback" not in loud.stderr
    assert len(loud.stderr.strip().splitlines()) == 1
    assert run_eval("--limit", "0").returncode == 2


def test_summary_and_tables_count_what_the_records_hold():
    def record(qid, correct, cites, calls):
        return {
            "id": qid, "repo": "json", "question": "?", "answer": "a | b",
            "grade": {"correct": correct, "file_ok": True, "symbol_ok": correct, "fact_ok": True,
                      "citations": [{"resolved": r, "why": ""} for r in cites]},
            "tool_calls": [{"ok": ok} for ok in calls], "expected_file": ["full"],
            "usage": {"ttft_s": 2.0, "decode_tok_s": 10.0, "prompt_tokens": 9,
                      "cached_tokens": 0},
            "wall_s": 3.0,
        }  # fmt: skip

    records = [record("a", True, [True, False], [True]), record("b", False, [True], [False]),
               {"id": "c", "repo": "json", "error": "EngineError: boom", "wall_s": 1.0}]  # fmt: skip
    s = summarize(records)
    assert (s["questions"], s["errors"], s["correct"]) == (3, 1, 1)
    assert (s["citations"], s["citations_resolved"]) == (3, 2)
    assert (s["tool_calls"], s["tool_calls_ok"], s["questions_with_tools"]) == (2, 1, 2)
    assert s["wall_s"] == 7.0
    run = {"model": "m", "weights_mode": "dense", "summary": s, "records": records,
           "repo_tokens": {"json": 11408}}  # fmt: skip
    assert s["correct_with_references"] == 1  # no references graded: as the text
    records[1]["grade_with_references"] = {**records[1]["grade"], "correct": True}
    s = summarize(records)
    assert (s["correct"], s["correct_with_references"]) == (1, 2)
    table = markdown([run | {"summary": s}], {"command": "python -m bench.answer_eval"})
    assert "| m | dense | 2/3 (67%) | 1/3 (33%) |" in table
    assert "a \\| b" in table and "EngineError: boom" in table
    assert "m's tokens: json 11,408." in table


@pytest.mark.slow
def test_one_question_end_to_end_with_a_real_model(tmp_path, default_checkpoint):
    out = tmp_path / "r.json"
    done = run_eval("--only", "json-01", "--context-tokens", "600", "--max-tokens", "24",
                    "--max-steps", "1", "--json", str(out), "--md", str(tmp_path / "r.md"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    (r,) = run["records"]
    assert r["id"] == "json-01" and "grade" in r, r
    assert r["usage"]["prompt_tokens"] > 0 and r["usage"]["completion_tokens"] >= 1
    assert set(r["grade"]) >= {"correct", "file_ok", "symbol_ok", "citations"}
    assert r["packing"].startswith("packed ")
    assert run["summary"]["questions"] == 1 and "| json-01 |" in (tmp_path / "r.md").read_text()


def test_regrade_grades_stored_answers_again(tmp_path):
    stored = {"meta": {"command": "python -m bench.answer_eval"}, "runs": [{
        "model": "m", "weights_mode": "dense", "records": [
            {"id": "json-01", "repo": "json", "question": "?", "tool_calls": [],
             "answer": "`detect_encoding` in json/__init__.py", "expected_file": ["full"],
             "usage": {}, "wall_s": 1.0, "grade": {"correct": False}},
            {"id": "json-03", "repo": "json", "question": "?", "tool_calls": [],
             "answer": "JSONDecodeError, in json/__init__.py", "expected_file": ["full"],
             "usage": {}, "wall_s": 1.0, "grade": {"correct": True}},
            {"id": "json-04", "repo": "json", "question": "?", "tool_calls": [],
             "answer": "It is `py_scanstring`, at json/scanner.py:73.", "expected_file": ["full"],
             "usage": {}, "wall_s": 1.0, "grade": {"correct": True}},
            {"id": "json-02", "repo": "json", "question": "?", "tool_calls": [],
             "answer": "`detect_encoding` returns 'utf-8-sig' (json/__init__.py:244).",
             "expected_file": ["full"], "usage": {}, "wall_s": 1.0,
             "checked": {"faults": ["..."], "first_answer": "'utf-8-sig', at json/x.py:9"}},
        ]}]}  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(stored))
    done = run_eval("--regrade", str(path), "--json", str(path))
    assert done.returncode == 0, done.stderr
    data = json.loads(path.read_text())
    first, second, third, fourth = data["runs"][0]["records"]
    assert first["grade"]["correct"] and not second["grade"]["correct"]
    assert second["grade_with_references"]["correct"]  # JSONDecodeError's file, listed
    # the model's text names the function and the wrong file; its references, computed now
    # from the files, say where it is: right as shown, wrong as written
    assert not third["grade"]["correct"] and third["grade_with_references"]["correct"]
    assert (
        third["references_at_regrade"]
        and "`py_scanstring`  json/decoder.py:" in third["references"]
    )
    assert "json/scanner.py:73: no class or function holds these lines" in third["references"]
    # citations are the model's: json/scanner.py:73 does not hold py_scanstring
    assert third["grade_with_references"]["citations"] == third["grade"]["citations"]
    assert third["grade"]["citations_resolved"] == 0
    # an answer the check asked again: the first answer is graded too, as it was shown
    assert fourth["grade_with_references"]["correct"]
    assert not fourth["checked"]["grade_with_references"]["correct"]
    summary = data["runs"][0]["summary"]
    assert (summary["correct"], summary["correct_with_references"]) == (2, 4)
    assert summary["answers_checked"] == 1
    assert (summary["checked_correct_before"], summary["checked_correct_after"]) == (0, 1)
    assert "| 1 (0 -> 1) |" in markdown(data["runs"], data["meta"])
    assert "regraded_by" in data["meta"]
    (tmp_path / "bad.json").write_text("[]")
    bad = run_eval("--regrade", str(tmp_path / "bad.json"))
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1


def test_resume_keeps_graded_answers_and_asks_only_the_rest(tmp_path):
    record = {"id": "json-01", "repo": "json", "question": "?", "tool_calls": [],
              "answer": "`detect_encoding` in json/__init__.py", "expected_file": ["full"],
              "usage": {}, "wall_s": 1.0,
              "grade": {"correct": True, "file_ok": True, "symbol_ok": True, "pair_ok": True,
                        "fact_ok": True, "citations": [], "citations_resolved": 0}}  # fmt: skip
    stored = {"meta": {"command": "python -m bench.answer_eval"},
              "runs": [{"model": "no-such-model", "weights": "auto", "weights_mode": "dense",
                        "records": [record]}]}  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(stored))
    # every question asked is answered already: no model is loaded (this one does not exist)
    args = ("--model", "no-such-model", "--only", "json-01", "--json", str(path), "--resume")
    done = run_eval(*args)
    assert done.returncode == 0, done.stderr
    data = json.loads(path.read_text())
    assert data["runs"][0]["records"] == [record] and data["meta"]["resumed_by"]
    more = run_eval("--model", "no-such-model", "--only", "json-01,json-02", "--json", str(path),
                    "--resume")  # fmt: skip
    assert more.returncode == 1 and "model not found: no-such-model" in more.stderr
    assert run_eval("--resume").returncode == 2
