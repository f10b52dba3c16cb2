"""The serve runner's thread and its hand-over of events: the engine loads on the thread
that steps it (a real engine of random weights), a load's error reaches the caller, and the
tokens that arrived together leave as one piece."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading

import pytest

from agentctx.serve.completions import pieces
from agentctx.serve.runner import EngineRunner, RequestHandle
from engine import Engine, EngineError, SamplingParams, StreamEvent
from engine.runtime.requests import GenerationStats
from tests.reliability.tiny_chat_model import TINY


def test_the_engine_loads_and_steps_on_the_runners_thread(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    seen = []

    def load():
        seen.append(threading.current_thread())
        return Engine.load(f"dummy:{tmp_path}", device="cpu")

    runner = EngineRunner(load)
    runner.start()
    engine = runner.loaded()
    assert seen == [runner._thread] and seen[0] is not threading.main_thread()

    async def one():
        handle = await runner.submit([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
        ids = [t for events in [e async for e in handle.events()] for e in events
               for t in e.token_ids]  # fmt: skip
        await runner.drain(5)
        return ids

    ids = asyncio.run(one())
    assert len(ids) == 4 and runner.steps >= 4 and runner.step_s > 0
    assert (
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
        == ids
    )  # (the thread's tokens are the engine's greedy ones)


def test_a_load_error_is_raised_to_the_caller():
    def load():
        raise EngineError("no such model: nowhere")

    runner = EngineRunner(load)
    runner.start()
    with pytest.raises(EngineError, match="nowhere"):
        runner.loaded()


def test_tokens_that_arrived_together_leave_as_one_piece():
    async def collect():
        handle = RequestHandle(request=None, queue=asyncio.Queue(), loop=asyncio.get_running_loop())
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


@pytest.mark.parametrize(("value", "says"), [("abc", "not a number"), ("5", "outside")])
def test_a_bad_switch_interval_is_one_line_before_the_model_loads(value, says, tmp_path):
    env = {**os.environ, "AGENTCTX_SWITCH_INTERVAL_S": value}
    proc = subprocess.run([sys.executable, "-m", "agentctx", "serve", "--port", "0",
                           "--model", str(tmp_path / "absent.gguf")],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "AGENTCTX_SWITCH_INTERVAL_S" in lines[0] and says in lines[0]
