"""`agentctx serve` with token-id prompts (OpenAI's token-array `prompt`), vLLM's
`return_token_ids` and `ignore_eos`, and a model without a tokenizer (random weights from a
config.json alone, as the H200 benchmarks serve): real server processes on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.app.serve_support import ServerProcess
from tests.reliability.tiny_chat_model import TINY, tiny_chat_model


@pytest.fixture(scope="module")
def server(default_checkpoint, tmp_path_factory):
    srv = ServerProcess(tiny_chat_model(tmp_path_factory.mktemp("tiny"),
                                        Path(default_checkpoint[0])))  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory):
    """A model that has weights and a window but no tokenizer: it takes and gives ids."""
    folder = tmp_path_factory.mktemp("bare")
    (folder / "config.json").write_text(json.dumps(TINY))
    srv = ServerProcess(f"dummy:{folder}")
    yield srv
    srv.stop()


def complete(server, stream: bool = False, **body):
    body = {"model": "tiny", "max_tokens": 8, "temperature": 0, **body}
    if not stream:
        return httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={**body, "stream": True}) as r:  # fmt: skip
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_a_token_id_prompt_answers_as_its_text_does(server):
    text = "Once upon a time there was"
    ids = httpx.post(server.url + "/tokenize", json={"model": "tiny", "prompt": text}).json()
    by_text = complete(server, prompt=text, return_token_ids=True).json()["choices"][0]
    by_ids = complete(server, prompt=ids["tokens"], return_token_ids=True).json()["choices"][0]
    assert by_ids == by_text
    assert len(by_text["token_ids"]) == 8 and by_text["text"]
    plain = complete(server, prompt=text).json()["choices"][0]
    assert "token_ids" not in plain and plain["text"] == by_text["text"]


def test_a_streamed_answer_with_token_ids_carries_every_token_in_order(server):
    whole = complete(server, prompt="The river", return_token_ids=True).json()["choices"][0]
    chunks = complete(server, stream=True, prompt="The river", return_token_ids=True)
    per_token = [c["choices"][0] for c in chunks if "token_ids" in c["choices"][0]]
    assert [t for c in per_token for t in c["token_ids"]] == whole["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt": [1, -2]}, "'prompt'"),
        ({"prompt": [1, True]}, "'prompt'"),
        ({"prompt": []}, "'prompt'"),
        ({"prompt": [[1, 2], [3]]}, "'prompt'"),  # a batch of two: n prompts are not served
        ({"prompt": [TINY["vocab_size"]]}, "vocabulary"),
        ({"prompt": "hi", "ignore_eos": "yes"}, "'ignore_eos'"),
        ({"prompt": "hi", "return_token_ids": 1}, "'return_token_ids'"),
    ],
)  # fmt: skip
def test_bad_token_prompts_get_400(server, body, message):
    r = complete(server, **body)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert complete(server, prompt=[5, 6, 7], max_tokens=2).status_code == 200


def test_a_model_without_a_tokenizer_serves_token_ids(bare_server):
    got = complete(bare_server, prompt=list(range(10, 40)), max_tokens=12, ignore_eos=True)
    assert got.status_code == 200, got.text
    choice, usage = got.json()["choices"][0], got.json()["usage"]
    assert len(choice["token_ids"]) == 12 == usage["completion_tokens"]
    assert usage["prompt_tokens"] == 30
    chunks = complete(bare_server, stream=True, prompt=list(range(10, 40)), max_tokens=12,
                      ignore_eos=True)  # fmt: skip
    assert [t for c in chunks for t in c["choices"][0].get("token_ids", [])] == choice["token_ids"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "m", "prompt": "text"}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        ("/tokenize", {"model": "m", "prompt": "text"}),
    ],
)  # fmt: skip
def test_text_to_a_model_without_a_tokenizer_gets_400(bare_server, path, body):
    r = httpx.post(bare_server.url + path, json=body, timeout=30)
    assert r.status_code == 400 and "tokenizer" in r.json()["error"]["message"], r.text
