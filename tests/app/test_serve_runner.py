"""The serve runner and the engine's own process (a real engine of random weights): the
process's greedy tokens are the engine's, an engine error reaches its request's caller and a
load's error the runner's, a dead process ends its requests with an error, and the tokens
that arrived together leave as one piece."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentctx.serve.completions import pieces
from agentctx.serve.engine_process import EngineSpec
from agentctx.serve.openai_schema import ApiError
from agentctx.serve.runner import EngineRunner, RequestHandle
from engine import ContextTooLongError, Engine, EngineError, SamplingParams, StreamEvent
from engine.runtime.requests import GenerationStats
from tests.reliability.tiny_chat_model import TINY


def test_the_engine_steps_in_its_own_process_and_gives_its_greedy_tokens(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    model = f"dummy:{tmp_path}"
    runner = EngineRunner(EngineSpec(model, device="cpu"))
    runner.start()
    facts = runner.loaded()
    engine = Engine.load(model, device="cpu")
    assert (facts.max_model_len, facts.vocab_size) == (
        engine.max_model_len, engine.model_config.vocab_size)  # fmt: skip
    assert runner.counters["kv_pages_free"] == runner.counters["kv_pages_total"] > 0

    async def one():
        handle = await runner.submit([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
        ids = [t for events in [e async for e in handle.events()] for e in events
               for t in e.token_ids]  # fmt: skip
        await runner.drain(5)
        return ids

    ids = asyncio.run(one())
    assert len(ids) == 4 and runner.counters["steps"] >= 4 and runner.active == 0
    assert runner._process.poll() == 0  # (drained: told to stop, and it exited)
    assert (
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
        == ids
    )  # (the process's tokens are the engine's greedy ones)


def test_an_engine_error_for_one_request_reaches_its_caller_and_the_next_one_runs(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    runner = EngineRunner(EngineSpec(f"dummy:{tmp_path}", device="cpu"))
    runner.start()
    window = runner.loaded().max_model_len

    async def two():
        with pytest.raises(ContextTooLongError, match="longer than the model's window"):
            await runner.submit([5] * (window + 3), SamplingParams(max_tokens=2))
        handle = await runner.submit([5, 6], SamplingParams(max_tokens=2, ignore_eos=True))
        got = [e for events in [e async for e in handle.events()] for e in events]
        await runner.drain(5)
        return got

    got = asyncio.run(two())
    assert got[-1].kind == "done" and got[-1].finish_reason == "length"


def test_a_load_error_is_raised_to_the_caller(tmp_path):
    runner = EngineRunner(EngineSpec(str(tmp_path / "absent.gguf"), device="cpu"))
    runner.start()
    with pytest.raises(EngineError, match="absent.gguf"):
        runner.loaded()
    assert runner._process.wait(30) == 0  # (it said why, then ended)


def test_requests_end_with_an_error_when_the_engines_process_dies(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    runner = EngineRunner(EngineSpec(f"dummy:{tmp_path}", device="cpu"))
    runner.start()
    runner.loaded()

    async def killed():
        handle = await runner.submit([5, 6], SamplingParams(max_tokens=100_000, ignore_eos=True))
        runner._process.kill()
        got = [e for events in [e async for e in handle.events()] for e in events]
        with pytest.raises(ApiError, match="the engine has stopped"):
            await runner.submit([5, 6], SamplingParams(max_tokens=2))
        return got

    got = asyncio.run(asyncio.wait_for(killed(), 60))
    assert got[-1].kind == "done" and "exited" in got[-1].finish_reason


def test_tokens_that_arrived_together_leave_as_one_piece():
    async def collect():
        handle = RequestHandle(1, asyncio.Queue(), asyncio.get_running_loop())
        for i, text in enumerate(["He", "llo", " there"]):
            handle.queue.put_nowait(StreamEvent("token", text=text, token_ids=[10 + i]))
        got = []
        reader = asyncio.ensure_future(_read(pieces(handle, None, [], ids=True), got))
        await asyncio.sleep(0)  # the three are read together
        handle.queue.put_nowait(StreamEvent("token", text="!", token_ids=[13]))
        await asyncio.sleep(0)
        handle.queue.put_nowait(StreamEvent("done", finish_reason="length",
                                            stats=GenerationStats()))  # fmt: skip
        await reader
        return got

    got = asyncio.run(collect())
    assert got[:4] == [("content", "Hello there"), ("ids", [10, 11, 12]), ("content", "!"),
                       ("ids", [13])]  # fmt: skip
    assert [k for k, _ in got[4:]] == ["calls", "done"]


async def _read(stream, into: list) -> None:
    async for item in stream:
        into.append(item)
