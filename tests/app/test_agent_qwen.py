"""The agent loop with a real model: Qwen2.5-Coder-0.5B-Instruct, asked about a function
whose body is not in the packed context, calls a tool for real (`agentctx ask` in a
subprocess, greedy, the exact fp32 weights) and answers with what the tool showed.

The model: AGENTCTX_TEST_QWEN_GGUF (a .gguf path), else the catalog's qwen2.5-coder-0.5b
when it is installed; the test is skipped when neither is there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import git
import pytest

QWEN_NAME = "qwen2.5-coder-0.5b"


def qwen_model() -> str | None:
    path = os.environ.get("AGENTCTX_TEST_QWEN_GGUF")
    if path:
        return path if os.path.isfile(path) else None
    from engine.loading import model_catalog

    known = model_catalog.lookup(QWEN_NAME)
    return QWEN_NAME if known is not None and model_catalog.is_installed(known) else None


FACT = "eu-north-7"
QUESTION = "What does default_region in regions.py return?"


@pytest.fixture
def regions_repo(tmp_path):
    """A module whose last function holds the fact, after enough others that a small
    packing budget leaves its body out (the repository map still names it)."""
    root = tmp_path / "shop"
    root.mkdir()
    lines = ['"""The shop\'s regions."""', ""]
    for i in range(12):
        lines += [f"def zone_{i}(value):", f'    """Zone {i} of the map."""',
                  f"    return value + {i}", ""]  # fmt: skip
    lines += ["def default_region():", '    """Where new shops are hosted."""',
              f'    return "{FACT}"', ""]  # fmt: skip
    (root / "regions.py").write_text("\n".join(lines))
    (root / "README.md").write_text("# shop\n\nHelpers for a small web shop.\n")
    repo = git.Repo.init(root)
    repo.index.add(["regions.py", "README.md"])
    repo.index.commit("shop")
    return root


@pytest.mark.slow
@pytest.mark.e2e
def test_qwen_reads_a_function_it_was_not_given(regions_repo):
    model = qwen_model()
    if model is None:
        pytest.skip(f"{QWEN_NAME} is not installed (or set AGENTCTX_TEST_QWEN_GGUF)")
    proc = subprocess.run(
        [sys.executable, "-m", "agentctx", "ask", QUESTION, "--repo", str(regions_repo),
         "--model", model, "--weights", "dense", "--context-tokens", "150",
         "--max-tokens", "100", "--max-steps", "2", "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    from sessions.store import SessionStore

    with SessionStore() as store:
        session = store.latest()
        packed = store.messages(session.id)[1].content  # the first user message
        stored = store.tool_calls(session.id)
    assert "default_region" in packed and FACT not in packed  # named, its body left out
    # a real call of read_file or grep ran, and its result holds the body
    ran = [c for c in stored if c.name in ("read_file", "grep") and c.error is None]
    assert ran and any(FACT in c.result for c in ran), [(c.name, c.error) for c in stored]
    results = [e for e in events if e["type"] == "tool_result" and "result" in e]
    assert any(e["name"] in ("read_file", "grep") for e in results)
    answer = "".join(e["text"] for e in events if e["type"] == "token")
    assert FACT in answer, answer
    usage = events[-1]
    assert usage["type"] == "usage" and usage["tool_calls_succeeded"] >= 1
