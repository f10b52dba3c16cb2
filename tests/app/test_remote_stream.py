"""A streamed chat completion assembled (agentctx.remote.chat_stream): text, tool calls in
pieces, usage with cached tokens; the conversation in the API's shape
(agentctx.remote.messages); named backends read from config.json
(agentctx.remote.backend_config)."""

from __future__ import annotations

import io
import json

import pytest

from agentctx.remote.backend import parsed_call, request_body
from agentctx.remote.backend_config import backend_spec
from agentctx.remote.chat_stream import ChatAssembly, StreamedCall, StreamError, sse_data
from agentctx.remote.messages import api_messages
from agentctx.tool_calls import UNPARSED
from engine import SamplingParams
from tools.errors import ToolError


def chunk(delta=None, finish=None, usage=None) -> str:
    body = {"choices": [] if delta is None else [{"index": 0, "delta": delta,
                                                 "finish_reason": finish}]}  # fmt: skip
    if usage is not None:
        body["usage"] = usage
    return "data: " + json.dumps(body)


def test_text_tool_call_pieces_and_usage_assemble():
    lines = [
        chunk({"role": "assistant", "content": ""}), "",
        ": keep-alive",
        chunk({"content": "Let me look."}),
        chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "read_file", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"calc.py"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_b",
                               "function": {"name": "grep", "arguments": '{"pattern": "add"}'}}]}),
        chunk({}, "tool_calls"),
        chunk(usage={"prompt_tokens": 900, "completion_tokens": 31,
                     "prompt_tokens_details": {"cached_tokens": 768}}),
        "data: [DONE]",
        chunk({"content": "after DONE: not read"}),
    ]  # fmt: skip
    reply = ChatAssembly()
    added = [reply.feed(c) for c in sse_data(lines)]
    assert "".join(added) == reply.content == "Let me look."
    calls = reply.tool_calls()
    assert [(c.id, c.name, json.loads(c.arguments)) for c in calls] == [
        ("call_a", "read_file", {"path": "calc.py"}),
        ("call_b", "grep", {"pattern": "add"}),
    ]
    assert reply.finish_reason == "tool_calls"
    assert (reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens) == (900, 31, 768)


def test_cached_tokens_from_llama_servers_timings_and_none_when_unsaid():
    reply = ChatAssembly()
    reply.feed({"choices": [], "usage": {"prompt_tokens": 5}, "timings": {"cache_n": 3}})
    assert reply.cached_tokens == 3
    assert ChatAssembly().cached_tokens is None


def test_an_error_event_or_a_bad_line_is_an_error():
    with pytest.raises(StreamError, match="mid-answer: out of memory"):
        list(sse_data(['data: {"error": {"message": "out of memory"}}']))
    with pytest.raises(StreamError, match="not JSON"):
        list(sse_data(["data: {oops"]))


def test_calls_with_bad_arguments_are_unparsed_calls_with_an_error():
    good = parsed_call(StreamedCall("c", "read_file", "{'path': 'calc.py',}"))  # model-written
    assert good.arguments == {"path": "calc.py"} and good.error is None
    bad = parsed_call(StreamedCall("c", "read_file", '{"path": '))
    assert bad.problem == UNPARSED and "not valid JSON" in bad.error
    listed = parsed_call(StreamedCall("c", "grep", "[1, 2]"))
    assert listed.problem == UNPARSED
    assert parsed_call(StreamedCall("c", "list_files", "")).arguments == {}


def test_the_conversation_goes_in_the_apis_shape():
    convo = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "grep", "arguments": {"pattern": "x"}}},
            {"type": "function", "function": {"name": "read_file", "arguments": {"path": "a"}}},
        ]},
        {"role": "tool", "name": "grep", "content": "a:1: x"},
        {"role": "tool", "name": "read_file", "content": "x = 1"},
        {"role": "assistant", "content": "x is 1", "token_ids": [5, 6]},
    ]  # fmt: skip
    out = api_messages(convo)
    calls = out[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ['{"pattern": "x"}', '{"path": "a"}']
    assert [m["tool_call_id"] for m in out[2:4]] == [c["id"] for c in calls]
    assert len({c["id"] for c in calls}) == 2
    assert "token_ids" not in out[4] and convo[4]["token_ids"] == [5, 6]  # (not changed)


def test_the_request_asks_for_usage_and_leaves_room_in_the_window():
    params = SamplingParams(max_tokens=400, temperature=0.0, repetition_penalty=1.1)
    body = request_body("m", [{"role": "user", "content": "q"}], None, params, room=100)
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 100 and body["repetition_penalty"] == 1.1
    assert "tools" not in body and "top_p" not in body
    tools = [{"type": "function", "function": {"name": "grep"}}]
    body = request_body("m", [{"role": "user", "content": "q"}], tools, SamplingParams(), 9999)
    assert body["tools"] == tools and body["tool_choice"] == "auto"
    assert body["max_tokens"] == 256 and "repetition_penalty" not in body


CONFIG = {"backends": {
    "cluster": {"url": "http://gpu1:8000/v1", "urls": ["http://gpu2:8000/v1"],
                "api_key_env": "CLUSTER_KEY", "model": "qwen-7b", "window": 32768},
    "broken": {"urls": ["gpu1:8000"]},
}}  # fmt: skip


def test_a_named_backend_gives_its_replicas_model_and_key_and_the_command_line_wins():
    spec = backend_spec("cluster", config=CONFIG)
    assert spec.urls == ["http://gpu1:8000/v1", "http://gpu2:8000/v1"]
    assert (spec.model, spec.api_key_env, spec.window) == ("qwen-7b", "CLUSTER_KEY", 32768)
    spec = backend_spec("cluster", model="other", api_key_env="MINE", config=CONFIG)
    assert (spec.model, spec.api_key_env) == ("other", "MINE")
    assert backend_spec("http://127.0.0.1:9/v1", config=CONFIG).urls == ["http://127.0.0.1:9/v1"]


def test_an_unknown_or_bad_backend_is_one_clear_error(monkeypatch):
    with pytest.raises(ToolError, match="no backend named 'gpu' .*it has: broken, cluster"):
        backend_spec("gpu", config=CONFIG)
    with pytest.raises(ToolError, match='backend "broken".*http://'):
        backend_spec("broken", config=CONFIG)
    monkeypatch.delenv("CLUSTER_KEY", raising=False)
    with pytest.raises(ToolError, match=r"\$CLUSTER_KEY is not set"):
        backend_spec("cluster", config=CONFIG).api_key()


def test_named_backends_are_read_from_config_json(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert backend_spec("cluster").urls[1] == "http://gpu2:8000/v1"


def test_without_a_tokenize_route_the_packing_says_its_counts_are_an_estimate(repo):
    from agentctx.conversation import Turn
    from agentctx.output import JsonOutput
    from agentctx.remote.backend import RemoteBackend
    from agentctx.remote.tokens import TokenCounter

    counter = TokenCounter(None, "m", "", "characters")
    assert counter.estimate and counter.count("x" * 9) == 3
    spec = backend_spec("http://127.0.0.1:9/v1", model="m", config={})
    backend = RemoteBackend(spec, None, "m", 8192, counter, None)  # (packing asks no server)
    out = io.StringIO()
    turn = Turn("What does add do?", str(repo), params=SamplingParams(max_tokens=100))
    messages, packed = backend.pack(turn, JsonOutput(out))
    assert "def add(a, b)" in messages[1]["content"] and packed.tokens > 0
    lines = [json.loads(line)["message"] for line in out.getvalue().splitlines()]
    assert lines[0].startswith("packed 2 files")
    assert (
        lines[-1] == "token counts are an estimate: ~4 characters a token (the server has no "
        "/tokenize and the model's tokenizer is not on this machine)"
    )
