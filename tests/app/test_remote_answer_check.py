"""The answer check (agentctx.answer_check) on a remote backend: an OpenAI-compatible server
on 127.0.0.1, real HTTP, whose model is scripted (one reply per chat completion, streamed
as server-sent events), and the app's RemoteBackend as its client. What the server was sent
shows the step that asks again."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentctx.conversation import Conversation, Turn
from agentctx.output import JsonOutput
from agentctx.remote.backend import RemoteBackend
from agentctx.remote.backend_config import BackendSpec
from engine import SamplingParams
from tests.app.test_answer_check import ASKS, RIGHT, WRONG, lib  # noqa: F401 (the fixture)


class ScriptedServer:
    """/v1/models serves one model; each /v1/chat/completions streams the next reply; the
    request bodies are kept (`sent`). No /tokenize: the client estimates its counts."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.sent = list(replies), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                if self.path != "/v1/models":
                    return self._json(404, {"error": {"message": "not found"}})
                self._json(200, {"data": [{"id": "scripted", "max_model_len": 8192}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/chat/completions":
                    return self._json(404, {"error": {"message": "not found"}})
                server.sent.append(body)
                text, finish = server.replies.pop(0), "stop"
                if isinstance(text, tuple):  # (text, its finish reason)
                    text, finish = text
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in (
                    {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]},
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                    {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 9}},
                ):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def _json(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(replies):
        servers.append(ScriptedServer(replies))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def remote_turn(server, root) -> tuple:
    backend = RemoteBackend.connect(BackendSpec(server.url, [server.url], "scripted"))
    turn = Turn(ASKS, str(root), "repo", params=SamplingParams(max_tokens=64, temperature=0.0))
    turn.messages = [{"role": "user", "content": ASKS}]
    out = io.StringIO()
    convo = Conversation(backend)
    convo.open(None, JsonOutput(out))
    result = convo.run(turn, JsonOutput(out))
    backend.client.close()
    return result, [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_contradicted_remote_answer_is_asked_again(serve, lib):  # noqa: F811
    server = serve([WRONG, RIGHT])
    result, events = remote_turn(server, lib)
    assert result.answer == RIGHT and result.usage["answer_check_kept_first"] is False
    assert len(result.usage["answer_check"]) == 2
    first, second = (body["messages"] for body in server.sent)
    assert second[: len(first)] == first  # the same prompt, then what the files say
    (asked,) = second[len(first) :]
    assert asked["role"] == "user" and "pkg/decoder.py has 22 lines" in asked["content"]
    assert WRONG not in json.dumps(second)
    assert [e["type"] for e in events].count("answer_check") == 1


def test_a_remote_answer_no_better_leaves_the_first(serve, lib):  # noqa: F811
    server = serve([WRONG, WRONG])
    result, events = remote_turn(server, lib)
    assert result.answer == WRONG and result.usage["answer_check_kept_first"] is True
    assert len(server.sent) == 2
    assert any("the first one stands" in e.get("message", "") for e in events)


def test_a_remote_answer_cut_at_the_token_limit_is_settled_too(serve, lib):  # noqa: F811
    server = serve([WRONG, (WRONG + " The", "length")])
    result, _ = remote_turn(server, lib)
    assert result.answer == WRONG and result.finish_reason == "stop"
    assert result.usage["answer_check_kept_first"] is True
