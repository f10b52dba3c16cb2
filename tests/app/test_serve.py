"""`agentctx serve` over real HTTP on 127.0.0.1: a real server process (uvicorn, the engine
stepping in a process of its own) and the official `openai` client, over a tiny random-weights model
with SmolLM2's tokenizer, and over a scripted-weights model for tool calls
(tests/app/serve_support.py). One slow test streams from the real default model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.app.serve_support import (
    ANSWER,
    TOOL_RESULT,
    WEATHER_TOOL,
    ServerProcess,
    scripted_tool_model,
)
from tests.reliability.tiny_chat_model import tiny_chat_model

KEY = "test-key-" + uuid.uuid4().hex
WINDOW = 4096  # tests/reliability/tiny_chat_model.py's max_position_embeddings


@pytest.fixture(scope="module")
def server(default_checkpoint, tmp_path_factory):
    model = tiny_chat_model(tmp_path_factory.mktemp("tiny"), Path(default_checkpoint[0]))
    srv = ServerProcess(model, "--api-key-env", "SERVE_TEST_KEY", "--max-body", "64KiB",
                        "--shutdown-timeout", "2", env={"SERVE_TEST_KEY": KEY})  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def health(server) -> dict:
    r = httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    return r.json()


def chat(client, content: str, **kw):
    messages = [{"role": "user", "content": content}]
    return client.chat.completions.create(model="tiny", messages=messages, **kw)


def test_it_binds_loopback_and_says_where(server):
    assert f"on http://127.0.0.1:{server.port}/v1" in server.banner
    assert "warning" not in server.banner


def test_a_host_that_is_not_loopback_gets_a_warning(tmp_path):
    argv = [sys.executable, "-m", "agentctx", "serve", "--host", "0.0.0.0", "--port", "0",
            "--model", str(tmp_path / "no-such-model")]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    warning, error = out.stderr.splitlines()  # (warned at the bind, before the model loads)
    assert warning.startswith("agentctx serve: warning: 0.0.0.0 is not a loopback address")
    assert "no --api-key-env" in warning
    assert error.startswith("agentctx: error: model not found") and out.returncode == 1


def test_a_streamed_chat_equals_the_non_streamed_one(client):
    greedy = {"temperature": 0, "max_tokens": 12}
    whole = chat(client, "Say something.", **greedy)
    chunks = list(chat(client, "Say something.", stream=True,
                       stream_options={"include_usage": True}, **greedy))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and whole.usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_a_text_completion_with_no_reused_prefix_reports_zero_cached(client):
    out = client.completions.create(model="tiny", prompt=f"z{uuid.uuid4().hex}", max_tokens=5,
                                    temperature=0)  # fmt: skip
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 5
    assert out.usage.prompt_tokens_details.cached_tokens == 0  # 0, not None


def test_a_streamed_text_completion_equals_the_whole_one(client):
    kw = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_second_request_with_the_same_long_prefix_reuses_it(client):
    system = " ".join(f"rule {i}: {uuid.uuid4().hex[:6]}." for i in range(80))  # ~900 tokens
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Go."}]
    ask = lambda: client.chat.completions.create(model="tiny", messages=messages,
                                                 temperature=0, max_tokens=16)  # fmt: skip
    first, second = ask(), ask()
    assert first.usage.prompt_tokens > 600
    assert first.usage.prompt_tokens_details.cached_tokens < 100  # the template's preamble
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
    assert second.choices[0].message.content == first.choices[0].message.content


def test_eight_concurrent_clients_complete_in_shared_steps(client, server):
    def one(i: int):
        return chat(client, f"Client {i} asks.", temperature=0, max_tokens=48)

    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(8)))
    assert all(o.usage.completion_tokens == 48 for o in outs)
    assert health(server)["max_batch"] >= 4  # several sequences ran in one engine step


def test_a_client_that_disconnects_frees_its_pages(server):
    before = health(server)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Go on and on."}],
            "max_tokens": 3000, "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=30) as r:  # fmt: skip
        lines = r.iter_lines()
        got = [next(lines) for _ in range(8)]
        during = health(server)
    assert any(line.startswith("data: {") for line in got)
    assert during["running"] == 1 and during["kv_pages_free"] < before["kv_pages_free"]
    deadline = time.monotonic() + 10
    while (now := health(server))["requests"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert now["requests"] == now["running"] == 0
    assert now["kv_pages_free"] == before["kv_pages_free"]


def post(server, body: bytes | str, key: str | None = KEY, path="/v1/chat/completions"):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return httpx.post(server.url + path, content=data, headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ("{not json", 400, None),
        ("[1, 2]", 400, None),
        ({"model": "tiny"}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0]"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
         400, "max_tokens"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
          "max_tokens": WINDOW + 1}, 400, "max_tokens"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
          "temperature": "hot"}, 400, "temperature"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
          "tools": [WEATHER_TOOL]}, 400, "tools"),  # SmolLM2's template takes no tools
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi " * 5000}]},
         400, "messages"),  # longer than the window
        ("x" * (65 << 10), 413, None),
    ],
)  # fmt: skip
def test_bad_requests_get_4xx_json_and_the_server_lives_on(server, client, body, status, param):
    r = post(server, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert chat(client, "Still there?", max_tokens=2).usage.completion_tokens == 2


def test_unknown_routes_and_methods_get_json(server):
    assert post(server, "{}", path="/v1/nothing").json()["error"]["type"] == "not_found_error"
    r = httpx.get(server.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 405 and "error" in r.json()


def test_a_missing_or_wrong_key_gets_401(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    for key in (None, "wrong", KEY + "x"):
        r = post(server, json.dumps(body), key=key)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/health").status_code == 401
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_models_lists_the_window(client):
    (card,) = client.models.list().data
    assert card.model_extra["context_length"] == card.model_extra["max_model_len"] == WINDOW


def stream_lines(server, max_tokens: int, lines: list[str], ended: threading.Event) -> None:
    """Stream a chat's lines into `lines` (in a thread); `ended` once the stream ends. EOS is
    ignored, so a stream runs to its `max_tokens` unless the server cuts it."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Write a lot."}],
            "max_tokens": max_tokens, "stream": True, "ignore_eos": True}  # fmt: skip
    try:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as r:  # fmt: skip
            for line in r.iter_lines():
                lines.append(line)  # (one by one: the test watches them arrive)
    except httpx.HTTPError:
        pass  # the server cut the stream at its shutdown timeout
    ended.set()


def test_sigterm_finishes_short_requests_cancels_long_ones_and_exits_0(server):
    streams = {n: ([], threading.Event()) for n in (4000, 24)}  # max_tokens: (lines, ended)
    for n, (lines, ended) in streams.items():
        threading.Thread(target=stream_lines, args=(server, n, lines, ended)).start()
        deadline = time.monotonic() + 30
        while not lines and time.monotonic() < deadline:
            time.sleep(0.01)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0
    assert time.monotonic() - t0 < 15  # --shutdown-timeout 2, then the request is cancelled
    (long, long_ended), (short, short_ended) = streams[4000], streams[24]
    assert long_ended.wait(10) and short_ended.wait(10)
    assert short[-2:] == ["data: [DONE]", ""] or short[-1] == "data: [DONE]"
    assert "data: [DONE]" not in long and len(long) > 4  # it had streamed, then was cut
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")


def engine_children(pid: int) -> list[int]:
    """The server's engine process (agentctx.serve.engine_process), by its command line."""
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"agentctx.serve.engine_process" in cmdline:
            out.append(int(child))
    return out


def test_the_engines_process_outlives_a_sigterm_but_not_the_server(default_checkpoint, tmp_path):
    model = tiny_chat_model(tmp_path / "tiny", Path(default_checkpoint[0]))
    srv = ServerProcess(model)
    try:
        [engine] = engine_children(srv.proc.pid)
        # a SIGTERM to the whole group reaches the engine too: the server decides when it ends
        os.kill(engine, signal.SIGTERM)
        body = {"model": "tiny", "prompt": "Hi", "max_tokens": 4}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        srv.proc.kill()  # (no drain, no "stop": the engine sees its pipe close)
        srv.proc.wait(30)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{engine}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        status = Path(f"/proc/{engine}/status")
        assert not status.exists() or "zombie" in status.read_text()
    finally:
        srv.stop()


# -- tools ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tool_server(default_checkpoint, tmp_path_factory):
    model, _ = scripted_tool_model(tmp_path_factory.mktemp("tools"), Path(default_checkpoint[0]))
    srv = ServerProcess(model, "--weights", "dense")
    yield srv
    srv.stop()


def test_a_tool_call_round_trip(tool_server):
    client = openai.OpenAI(base_url=tool_server.url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL],
                                           temperature=0, max_tokens=64)  # fmt: skip
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "weather" and json.loads(call.function.arguments) == {
        "city": "Paris"
    }
    streamed = list(client.chat.completions.create(
        model="m", messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=64,
        stream=True))  # fmt: skip
    assert not "".join(c.choices[0].delta.content or "" for c in streamed)  # no markup shown
    (delta,) = [d for c in streamed for d in c.choices[0].delta.tool_calls or []]
    assert delta.function.name == "weather" and delta.function.arguments == call.function.arguments
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}]  # fmt: skip
    second = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL],
                                            temperature=0, max_tokens=64)  # fmt: skip
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
    assert second.usage.prompt_tokens_details.cached_tokens > 0  # the first turn's pages


def test_tool_choice_none_leaves_the_text_unparsed(tool_server):
    client = openai.OpenAI(base_url=tool_server.url + "/v1", api_key="none", max_retries=0)
    out = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL],
        tool_choice="none", temperature=0, max_tokens=64)  # fmt: skip
    assert out.choices[0].finish_reason == "stop" and not out.choices[0].message.tool_calls
    assert out.choices[0].message.content.startswith("<tool_call>")


# -- the real default model ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.e2e
def test_a_streamed_chat_from_the_default_model():
    from agentctx.models import DEFAULT_MODEL
    from engine.loading import model_catalog

    try:
        model_catalog.verified_files(model_catalog.lookup(DEFAULT_MODEL))
    except Exception as e:  # not installed, or its check fails
        pytest.skip(f"{DEFAULT_MODEL} is not installed: {e}")
    srv = ServerProcess(DEFAULT_MODEL)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        stream = client.chat.completions.create(
            model=DEFAULT_MODEL, temperature=0, max_tokens=24, stream=True,
            messages=[{"role": "user", "content": "What is the capital of France?"}])  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert "Paris" in text
    finally:
        assert srv.stop() == 0
