"""Reuse past the answer after a restart: a follow-up in a new `agentctx ask -c` process,
its KV restored from the session's snapshot, reuses the KV of the previous answer too, not
only of the prompt before it. The answer is stored with the ids it was generated as and the
next prompt holds them; its text encoded again gives other ids (checked here), so the same
store without them diverges where the answer starts. Real processes, a real SQLite store and
snapshot, a tiny random-weights model with SmolLM2's tokenizer (tests/reliability/
tiny_chat_model.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from agentctx.ask import answer_ids
from engine import Engine, SamplingParams
from sessions.store import SessionStore
from tests.reliability.support import make_repo
from tests.reliability.tiny_chat_model import tiny_chat_model

FILES = {
    "README.md": "# greeter\n\nPrints a friendly greeting.\n",
    "greet.py": 'def greet(name):\n    return f"Hello, {name}!"\n',
}
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def model(default_checkpoint, tmp_path_factory) -> str:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny"), default_checkpoint[0])


def ask(home, model: str, *args: str) -> tuple[dict, list[str]]:
    """(usage record, info lines) of one `agentctx ask ... --json` process."""
    argv = [sys.executable, "-m", "agentctx", "ask", *args, "--model", model, "--json",
            "--max-tokens", str(MAX_TOKENS)]  # fmt: skip
    env = {**os.environ, "AGENTCTX_HOME": str(home)}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    infos = [e["message"] for e in events if e["type"] == "info"]
    (usage,) = [e for e in events if e["type"] == "usage"]
    return usage, infos


def restored(infos: list[str]) -> int:
    (line,) = [i for i in infos if i.startswith("restored ")]
    return int(re.match(r"restored ([\d,]+) tokens", line).group(1).replace(",", ""))


def test_a_follow_up_after_a_restart_reuses_the_answers_kv(home, model, tmp_path):
    repo = make_repo(tmp_path / "greeter", FILES)
    first, _ = ask(home, model, "What does greet return?", "--repo", str(repo))
    with SessionStore(home / "sessions.db") as store:
        answer = store.messages(first["session"])[-1]
    tokenizer = AutoTokenizer.from_pretrained(model.removeprefix("dummy:"))
    ids = answer.token_ids
    assert ids and len(ids) >= first["completion_tokens"] - 1  # (less a closing eos)
    assert tokenizer.decode(ids, skip_special_tokens=True) == answer.content
    # not vacuous: the stored text alone would be encoded as other ids than generated
    assert tokenizer(answer.content, add_special_tokens=False)["input_ids"] != ids
    # the same store and snapshot with the ids left out, as before they were kept
    plain_home = tmp_path / "plain"
    shutil.copytree(home, plain_home, symlinks=True)
    with sqlite3.connect(plain_home / "sessions.db") as db:
        db.execute("update messages set token_ids = null")
    turn1_prompt = first["prompt_tokens"]  # where the answer starts

    pinned, infos = ask(home, model, "-c", "And where is it tested?")
    held = restored(infos)  # turn 1's whole pages: its prompt and most of its answer
    assert held > turn1_prompt + 16
    assert "diverged_at" not in pinned, pinned
    assert pinned["cached_tokens"] == held  # through the answer, to the snapshot's end

    plain, infos = ask(plain_home, model, "-c", "And where is it tested?")
    assert restored(infos) == held
    assert plain["diverged_at"] <= turn1_prompt  # the re-tokenized answer differs at once
    assert plain["cached_tokens"] == plain["diverged_at"] // 16 * 16 < turn1_prompt
    print(f"\ncached tokens of {held} restored: {pinned['cached_tokens']} with the answer's"
          f" ids, {plain['cached_tokens']} without (diverged at {plain['diverged_at']};"
          f" the answer starts at {turn1_prompt})")  # fmt: skip


def test_only_ids_whose_text_is_the_answer_are_kept(model):
    engine = Engine.load(model, device="cpu", dtype="float32")
    prompt = engine.chat_tokens([{"role": "user", "content": "Say hello."}])
    stream = engine.stream(prompt, SamplingParams(max_tokens=12))
    for _ in stream:
        pass
    assert answer_ids(engine, stream, stream.text) == stream.token_ids
    # a text that is not theirs (edited, or replaced as a step limit's note is): none
    assert answer_ids(engine, stream, stream.text + " (edited)") is None
    assert answer_ids(engine, stream, "") is None
    # the end-of-turn id that closed an answer is the template's to render, not the answer's
    (eos, *_) = sorted(engine.eos_token_ids)
    closed = SimpleNamespace(token_ids=[*stream.token_ids, eos])
    assert answer_ids(engine, closed, stream.text) == stream.token_ids
