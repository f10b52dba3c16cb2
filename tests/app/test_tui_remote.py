"""`agentctx tui --backend`: the TUI, driven with Pilot, running its turns on a real
`agentctx serve` process on 127.0.0.1 (the tiny random-weights model): the answer streams,
the turn is stored with the server's model, the meter shows the server's window; a server
that is down is one error line and nothing stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentctx.remote.backend import connect_backend
from agentctx.tui.app import AgentApp
from agentctx.tui.widgets import AssistantMessage, ContextMeter, LogLine
from engine import SamplingParams
from tests.app.serve_support import ServerProcess, free_port
from tests.app.test_tui import SIZE, finish, submit, texts
from tests.reliability.tiny_chat_model import tiny_chat_model

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def tiny(default_checkpoint, tmp_path_factory) -> str:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny"), Path(default_checkpoint[0]))


@pytest.fixture(scope="module")
def server(tiny):
    srv = ServerProcess(tiny)
    yield srv
    srv.stop()


def remote_app(url: str, model: str | None, repo, store) -> AgentApp:
    def must_not_load(name):
        raise AssertionError("the TUI loaded an engine although a backend was given")

    return AgentApp(repo=str(repo), model=model, store=store, engine_factory=must_not_load,
                    params=SamplingParams(max_tokens=8),
                    connect=lambda: connect_backend(url, model, None))  # fmt: skip


async def test_a_turn_runs_on_the_backend_and_is_stored(server, tiny, repo, store):
    app = remote_app(server.url + "/v1", tiny, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "What does add do?")
        await finish(pilot)
        (answer,) = texts(app, AssistantMessage)
        assert answer and app.engine is None  # (random weights: any text)
        assert app.screen.query_one(ContextMeter).window == 4096  # from the server's /v1/models
        await submit(pilot, "And sub?")  # the second turn reuses the connection
        await finish(pilot)
        answers = texts(app, AssistantMessage)
        assert len(answers) == 2
    (session,) = store.list()
    assert session.model == tiny
    contents = [m.content for m in store.messages(session.id)]
    assert contents[-1] == answers[-1] and len(contents) >= 4


async def test_a_backend_that_is_down_is_one_error_line(repo, store):
    app = remote_app(f"http://127.0.0.1:{free_port()}/v1", "m", repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "What does add do?")
        await finish(pilot)
        errors = [t for t in texts(app, LogLine) if "cannot reach the backend" in t]
        assert len(errors) == 1 and not texts(app, AssistantMessage)
        assert not app.busy
    assert store.list() == []
