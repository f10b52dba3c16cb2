"""RemoteBackend (agentctx.remote) over real HTTP on 127.0.0.1: `agentctx serve` in its own
process (tests/app/serve_support.py) with the tiny random-weights model, and with the
scripted model that calls a tool. The backend finds the model, the window and the server's
/tokenize; its turn equals the embedded engine's on the same weights; a tool call goes
through the API's tools field and runs here; a server that is down, a refused key, a 4xx
and a model the server lacks are each one RemoteError that says so."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import httpx
import pytest

from agentctx.backend import EmbeddedBackend
from agentctx.conversation import Conversation, Turn
from agentctx.output import JsonOutput
from agentctx.remote.backend import RemoteBackend
from agentctx.remote.backend_config import BackendSpec
from agentctx.remote.client import RemoteError
from engine import SamplingParams
from tests.app import serve_support
from tests.app.serve_support import (
    ServerProcess,
    refusing_port,
    scripted_tool_model,
)
from tests.reliability.tiny_chat_model import tiny_chat_model

GREP_RESULT = "calc.py:1: def add(a, b):"  # grep add in the `repo` fixture
KEY = "remote-key-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def tiny(default_checkpoint, tmp_path_factory) -> str:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny"), Path(default_checkpoint[0]))


@pytest.fixture(scope="module")
def server(tiny):
    srv = ServerProcess(tiny, "--api-key-env", "REMOTE_TEST_KEY", env={"REMOTE_TEST_KEY": KEY})
    yield srv
    srv.stop()


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("REMOTE_TEST_KEY", KEY)
    return "REMOTE_TEST_KEY"


def spec(server, model, key_env, **kw) -> BackendSpec:
    return BackendSpec(server.url + "/v1", [server.url + "/v1"], model, key_env, **kw)


def run_turn(backend, root, question: str, max_tokens: int = 16):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, repetition_penalty=1.1)
    turn = Turn(question, str(root), "repo", params=params)
    convo = Conversation(backend)
    out = io.StringIO()
    output = JsonOutput(out)
    convo.pack(turn, None, output)
    convo.open(None, output)
    return convo.run(turn, output), turn, out.getvalue()


def test_tokenize_counts_as_the_engine_does(server, tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny.removeprefix("dummy:"))
    auth = {"Authorization": f"Bearer {KEY}"}
    text = "def add(a, b):\n    return a + b\n"
    r = httpx.post(server.url + "/tokenize", json={"model": tiny, "prompt": text}, headers=auth)
    assert r.status_code == 200
    assert r.json()["tokens"] == tok.encode(text, add_special_tokens=False)
    assert r.json()["count"] == len(r.json()["tokens"]) and r.json()["max_model_len"] == 4096
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = httpx.post(server.url + "/tokenize", json={"model": tiny, "messages": messages},
                   headers=auth)  # fmt: skip
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert r.json()["tokens"] == list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    r = httpx.post(server.url + "/tokenize", json={"messages": "x"}, headers=auth)
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    assert httpx.post(server.url + "/tokenize", json={"prompt": "x"}).status_code == 401


def test_the_local_tokenizer_counts_as_the_server_does(server, tiny, keyed):
    from agentctx.remote.tokens import TokenCounter, local_tokenizer

    backend = RemoteBackend.connect(spec(server, tiny, keyed))
    local = TokenCounter(None, tiny, "", "tokenizer", local_tokenizer(tiny))
    assert local.tokenizer is not None and local.estimate
    text = "def add(a, b):\n    return a + b\n"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    assert local.count(text) == backend.counter.count(text) > 0
    assert local.chat_count(messages) == backend.counter.chat_count(messages)


def test_the_backend_finds_the_model_window_and_counter(server, tiny, keyed):
    backend = RemoteBackend.connect(spec(server, tiny, keyed))
    assert (backend.model, backend.window) == (tiny, 4096)
    assert backend.counter.source == "server" and not backend.counter.estimate
    assert backend.tool_fmt is None  # SmolLM2's template ignores the tools it is given
    alone = RemoteBackend.connect(spec(server, None, keyed))  # the one model served
    assert alone.model == tiny


def test_a_turn_equals_the_embedded_engines_and_reports_the_servers_usage(server, tiny, keyed,
                                                                         repo):  # fmt: skip
    remote, rturn, log = run_turn(RemoteBackend.connect(spec(server, tiny, keyed)), repo,
                                  "What does add do?")  # fmt: skip
    local, lturn, _ = run_turn(EmbeddedBackend.load(tiny, device="cpu"), repo, "What does add do?")
    assert rturn.messages == lturn.messages  # the same packing: the server's counts
    assert remote.answer == local.answer and remote.answer
    assert remote.finish_reason == local.finish_reason == "length"
    usage = remote.usage
    assert usage["prompt_tokens"] == local.usage["prompt_tokens"]
    assert usage["completion_tokens"] == 16 and usage["finish_reason"] == "length"
    assert usage["cached_tokens"] >= 0 and usage["backend"] == server.url + "/v1"
    assert '"kind": "text"' in log or '"text"' in log
    again, _, _ = run_turn(RemoteBackend.connect(spec(server, tiny, keyed)), repo,
                           "What does add do?")  # fmt: skip
    assert again.answer == remote.answer
    assert again.usage["cached_tokens"] > 0  # the same prompt: the server's prefix cache


def test_a_server_that_refuses_tools_gets_the_turn_without_them(server, tiny, keyed, repo):
    forced = RemoteBackend.connect(spec(server, tiny, keyed, tools=True))
    assert forced.tool_fmt == "hermes"  # offered: the config says the model takes tools
    result, _, log = run_turn(forced, repo, "What is calc?", max_tokens=4)
    assert "the backend takes no tools (this model's chat template takes no tools)" in log
    assert forced.tool_fmt is None and result.usage["completion_tokens"] == 4
    plain, _, _ = run_turn(RemoteBackend.connect(spec(server, tiny, keyed)), repo, "What is calc?",
                           max_tokens=4)  # fmt: skip
    assert result.answer == plain.answer


def test_a_replica_that_is_down_is_passed_over(server, tiny, keyed, repo):
    # the dead replica is the first choice of the requests made on connecting (PROBE_KEY),
    # so it is tried whichever replica the turn's new session id picks
    from agentctx.remote.backend import PROBE_KEY

    with refusing_port(PROBE_KEY, server.url + "/v1") as port:
        dead = f"http://127.0.0.1:{port}/v1"
        urls = [dead, server.url + "/v1"]
        backend = RemoteBackend.connect(BackendSpec("two", urls, tiny, keyed))
        result, _, _ = run_turn(backend, repo, "What is calc?", max_tokens=4)
    assert result.usage["completion_tokens"] == 4
    assert backend.client.replicas.down == {dead}


def test_a_server_that_is_down_is_one_clear_error(tiny):
    with (
        refusing_port() as port,
        pytest.raises(
            RemoteError, match=rf"cannot reach the backend: .*:{port}/v1 \(connection refused\)"
        ),
    ):
        url = f"http://127.0.0.1:{port}/v1"
        RemoteBackend.connect(BackendSpec(url, [url], tiny))


def test_a_missing_or_wrong_key_is_refused(server, tiny, monkeypatch):
    with pytest.raises(
        RemoteError, match=r"refused the request \(401: a valid API key.*--api-key-env"
    ):
        RemoteBackend.connect(spec(server, tiny, None))
    monkeypatch.setenv("WRONG_KEY", "nope")
    with pytest.raises(RemoteError, match=r"401.*check the key in \$WRONG_KEY"):
        RemoteBackend.connect(spec(server, tiny, "WRONG_KEY"))


def test_a_model_the_server_lacks_is_named_with_what_it_serves(server, tiny, keyed):
    with pytest.raises(RemoteError, match=rf"serves no model 'qwen-7b' \(it serves: {tiny}\)"):
        RemoteBackend.connect(spec(server, "qwen-7b", keyed))


def test_a_4xx_carries_the_servers_message(server, tiny, keyed):
    backend = RemoteBackend.connect(spec(server, tiny, keyed))
    body = {"model": tiny, "messages": [{"role": "user", "content": "x"}], "n": 2, "stream": True}
    refused = pytest.raises(RemoteError, match="answered 400: only n=1 is supported")
    with refused as e, backend.client.stream_chat(body, "s-1") as chunks:
        list(chunks)
    assert e.value.status == 400


# -- a tool call through the API's tools field ------------------------------------------------


@pytest.fixture(scope="module")
def tool_model(default_checkpoint, tmp_path_factory):
    """The scripted model, its call a grep of the repository (written with the quoting
    that keeps its tokens distinct, which the parser repairs) and its answer after that
    tool's result on the `repo` fixture."""
    mp = pytest.MonkeyPatch()
    mp.setattr(serve_support, "TOOL_CALL", "<tool_call>{\"name\": \"grep\",'pattern':'add'}")
    mp.setattr(serve_support, "TOOL_RESULT", GREP_RESULT)
    try:
        model, _ = scripted_tool_model(tmp_path_factory.mktemp("tools"),
                                       Path(default_checkpoint[0]))  # fmt: skip
    finally:
        mp.undo()
    srv = ServerProcess(model, "--weights", "dense")
    yield model, srv
    srv.stop()


def one_call_turn(backend, turn) -> tuple:
    """(the turn's result, its --json events, its one step's one call), run on `backend`."""
    import json

    out = io.StringIO()
    convo = Conversation(backend)
    convo.open(None, JsonOutput(out))
    result = convo.run(turn, JsonOutput(out))
    (step,) = result.steps
    (call,) = step.calls
    return result, [json.loads(line) for line in out.getvalue().splitlines()], call


def test_a_tool_call_runs_here_and_its_result_goes_back(tool_model, repo):
    model, srv = tool_model
    backend = RemoteBackend.connect(BackendSpec(srv.url, [srv.url], model))
    assert backend.tool_fmt == "hermes"
    turn = Turn("Where is add?", str(repo), "repo",
                params=SamplingParams(max_tokens=64, temperature=0.0), max_steps=2)  # fmt: skip
    turn.messages = [{"role": "user", "content": turn.question}]
    result, _, call = one_call_turn(backend, turn)
    assert (call.name, call.arguments) == ("grep", {"pattern": "add"})
    assert call.error is None and call.result == GREP_RESULT
    assert result.answer == serve_support.ANSWER and result.finish_reason == "stop"
    assert result.usage["steps"] == 2 and result.usage["tool_calls_succeeded"] == 1
    assert result.usage["cached_tokens"] > 0  # the second step reused the first's prompt


def test_a_tool_result_that_fills_the_window_leaves_the_earlier_turns_out(tool_model, repo):
    """Mid-turn, as the embedded loop does: the step after a grep whose result would
    overflow the window leaves the session's earlier turns out, and the turn goes on."""
    model, srv = tool_model
    adders = "".join(f"def add_{i}(a, b):\n    return a + b + {i}\n" for i in range(40))
    (repo / "adders.py").write_text(adders)  # 40 more lines for grep 'add' to return
    turn = Turn("Where is add?", str(repo), "repo",
                params=SamplingParams(max_tokens=64, temperature=0.0), max_steps=2)  # fmt: skip
    earlier = []
    for i in range(6):
        earlier += [{"role": "assistant", "content": f"Answer {i}: " + "calc adds. " * 60},
                    {"role": "user", "content": f"Question {i}?"}]  # fmt: skip
    root = {"role": "user", "content": "Repository files: calc.py\n\nQuestion: What is calc?"}
    turn.messages = [root, *earlier[:-1], {"role": "user", "content": turn.question}]
    probe = RemoteBackend.connect(BackendSpec(srv.url, [srv.url], model))
    first = probe.prompt_tokens(turn, turn.messages)
    probe.client.close()
    window = first + 64 + 120  # the first step fits; the grep's result does not
    backend = RemoteBackend.connect(BackendSpec(srv.url, [srv.url], model, window=window))
    result, events, call = one_call_turn(backend, turn)
    assert call.name == "grep" and call.result.count("add") > 40  # the big result was sent
    (compaction,) = [e for e in events if e["type"] == "compaction"]
    assert compaction["left_out"]["turns"] > 0 and compaction["prompt_tokens"] + 64 <= window
    assert result.usage["prompt_tokens"] + 64 <= window
