"""`agentctx ask --backend` end to end: real processes on 127.0.0.1, `agentctx serve` in one
and `agentctx ask` in another, the turn stored in the real session store. The answer equals
the embedded engine's for the same question (greedy); a server that is down, a refused key
and a model the server lacks each end `ask` with one error line, exit 1, nothing stored.
The tiny random-weights model keeps these fast; one slow test runs SmolLM2 itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.app.serve_support import ServerProcess, free_port
from tests.reliability.tiny_chat_model import tiny_chat_model

KEY = "cli-key-" + uuid.uuid4().hex
QUESTION = "What does add do?"


def ask(*args: str, env: dict | None = None, max_tokens: int = 12) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "agentctx", "ask", QUESTION, "--max-tokens", str(max_tokens),
            *args]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})  # fmt: skip


def stored() -> list:
    from sessions.store import SessionStore

    store = SessionStore()
    try:
        return [(s.id, [m.content for m in store.messages(s.id)]) for s in store.list()]
    finally:
        store.close()


@pytest.fixture(scope="module")
def tiny(default_checkpoint, tmp_path_factory) -> str:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny"), Path(default_checkpoint[0]))


@pytest.fixture(scope="module")
def server(tiny):
    srv = ServerProcess(tiny, "--api-key-env", "CLI_TEST_KEY", env={"CLI_TEST_KEY": KEY})
    yield srv
    srv.stop()


def test_ask_on_a_backend_answers_as_the_embedded_engine_and_stores_the_turn(server, tiny, repo):
    name = f"remote-{uuid.uuid4().hex[:8]}"
    remote = ask("--backend", server.url + "/v1", "--model", tiny, "--api-key-env",
                 "CLI_TEST_KEY", "--repo", str(repo), "--session", name, "--json",
                 env={"CLI_TEST_KEY": KEY})  # fmt: skip
    assert remote.returncode == 0, remote.stderr
    events = [json.loads(line) for line in remote.stdout.splitlines()]
    answer = "".join(e["text"] for e in events if e.get("type") == "token")
    usage = next(e for e in events if e.get("type") == "usage")
    local = ask("--model", tiny, "--device", "cpu", "--repo", str(repo), "--json")
    assert local.returncode == 0, local.stderr
    local_events = [json.loads(line) for line in local.stdout.splitlines()]
    assert answer and answer == "".join(e["text"] for e in local_events if e.get("type") == "token")
    assert usage["completion_tokens"] == 12 and usage["backend"] == server.url + "/v1"
    session = usage["session"]
    turns = dict(stored())[session]
    assert turns[-2].endswith(f"Question: {QUESTION}") and turns[-1] == answer
    follow = ask("--session", name, "--backend", server.url + "/v1", "--api-key-env", "CLI_TEST_KEY",
                 "--json", env={"CLI_TEST_KEY": KEY})  # fmt: skip
    assert follow.returncode == 0, follow.stderr
    usage = next(e for e in map(json.loads, follow.stdout.splitlines()) if e["type"] == "usage")
    assert usage["session"] == session and usage["cached_tokens"] > 0  # the first turn's prefix


@pytest.mark.parametrize("case", ["down", "no key", "wrong model", "unknown name"])
def test_a_backend_that_fails_is_one_error_line_and_nothing_stored(server, tiny, repo, case):
    url = server.url + "/v1"
    args, expected = {
        "down": (["--backend", f"http://127.0.0.1:{free_port()}/v1", "--model", tiny],
                 "cannot reach the backend: http://127.0.0.1:"),
        "no key": (["--backend", url, "--model", tiny], "refused the request (401"),
        "wrong model": (["--backend", url, "--model", "qwen-7b", "--api-key-env", "CLI_TEST_KEY"],
                        "serves no model 'qwen-7b'"),
        "unknown name": (["--backend", "cluster"], "no backend named 'cluster'"),
    }[case]  # fmt: skip
    before = stored()
    out = ask(*args, "--repo", str(repo), env={"CLI_TEST_KEY": KEY})
    lines = [line for line in out.stderr.splitlines() if line.startswith("agentctx: error:")]
    assert out.returncode == 1 and len(lines) == 1 and expected in lines[0], out.stderr
    assert "Traceback" not in out.stderr and not out.stdout
    assert stored() == before


@pytest.mark.slow
@pytest.mark.e2e
def test_smollm2_served_answers_as_embedded(default_checkpoint, repo):
    """The real default test model (SmolLM2-135M), greedy, through agentctx serve."""
    srv = ServerProcess("smollm2-135m")
    try:
        remote = ask("--backend", srv.url + "/v1", "--model", "smollm2-135m", "--repo", str(repo),
                     max_tokens=48)  # fmt: skip
        local = ask("--model", "smollm2-135m", "--repo", str(repo), max_tokens=48)
    finally:
        srv.stop()
    assert remote.returncode == 0 and local.returncode == 0, remote.stderr + local.stderr
    assert remote.stdout.strip() and remote.stdout == local.stdout


def test_a_remote_session_past_the_window_goes_on_and_says_what_it_left_out(
    server, tiny, repo, tmp_path
):
    """The server's prompt counts (its /tokenize) drive the compaction a follow-up needs:
    with config.json giving the named backend a window a few turns longer than the first
    prompt, the follow-ups that would overflow it leave the oldest turns out, say so, and
    answer; the store keeps every turn."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"CLI_TEST_KEY": KEY, "AGENTCTX_HOME": str(home)}
    first = ask("--backend", server.url + "/v1", "--api-key-env", "CLI_TEST_KEY", "--repo",
                str(repo), "--session", "long", "--json", env=env)  # fmt: skip
    assert first.returncode == 0, first.stderr
    usage = next(e for e in map(json.loads, first.stdout.splitlines()) if e["type"] == "usage")
    window = usage["prompt_tokens"] + 12 + 80  # room for the answer and a few short turns
    backend = {"url": server.url + "/v1", "api_key_env": "CLI_TEST_KEY", "window": window}
    (home / "config.json").write_text(json.dumps({"backends": {"small": backend}}))
    said = []
    for _ in range(6):
        follow = ask("--backend", "small", "--session", "long", env=env)
        assert follow.returncode == 0, follow.stderr
        said += [x for x in follow.stderr.splitlines() if x.startswith("context: left out")]
    assert said and f"{window:,}-token window" in said[0]
    from sessions.store import SessionStore

    with SessionStore(home / "sessions.db") as store:
        (session,) = store.list()
        answers = [m for m in store.messages(session.id) if m.role == "assistant"]
    assert len(answers) == 7
