"""A context that never dead-ends, in the TUI, driven with Pilot: `/compact` leaves the
earlier turns out of the next prompt (the packed context stays whole, the store keeps every
message), and a turn that would not fit the window leaves out what it must and says so in
the log. The model's side is scripted (tests/app/scripted.py) over the tests' default
model's tokenizer, with a chat template that takes tools, so a turn calls a real tool on a
real git repository; the store is a real SQLite file."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from agentctx.tui.app import AgentApp
from agentctx.tui.widgets import AssistantMessage, LogLine
from engine.loading.loader import resolve_source
from tests.app.pilot_support import finish, submit
from tests.app.scripted import ScriptedEngine
from tests.app.tool_templates import HERMES

SIZE = (100, 30)
pytestmark = pytest.mark.anyio
READ = "<tool_call>" + json.dumps({"name": "read_file", "arguments": {"path": "calc.py"}})
READ += "</tool_call>"


@pytest.fixture(scope="module")
def tokenizer_path(agentctx_home):
    return resolve_source(None).path


def scripted(tokenizer_path, replies, template=HERMES, window=8192) -> ScriptedEngine:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    return ScriptedEngine(tokenizer, template or tokenizer.chat_template, replies, window)


def log_lines(app) -> list[str]:
    return [str(w.render()) for w in app.screen.query(LogLine)]


def stored(store, session_id) -> tuple[list, list]:
    messages = [(m.role, m.content, m.status) for m in store.messages(session_id)]
    calls = [(c.name, c.result) for c in store.tool_calls(session_id)]
    return messages, calls


async def test_compact_leaves_the_earlier_turns_out_of_the_next_prompt(tokenizer_path, repo, store):
    engine = scripted(tokenizer_path, [
        READ, "add returns a + b (calc.py:2).",  # turn 1: a tool step, then the answer
        "It takes two numbers.",  # turn 2
        "Yes, floats too.",  # turn 3, after /compact
    ])  # fmt: skip
    app = AgentApp(repo=str(repo), engine_factory=lambda model: engine, store=store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "/compact")
        assert "nothing to compact" in log_lines(app)[-1]
        await submit(pilot, "What does add return?")
        await finish(pilot)
        await submit(pilot, "What does it take?")
        await finish(pilot)
        sid = app.session.id
        kept = stored(store, sid)
        full = len(engine.prompts[-1])
        await submit(pilot, "/compact")
        line = log_lines(app)[-1]
        assert line.startswith("compacted: the next question leaves out the oldest turn and 1 "
                               "tool result"), line  # fmt: skip
        assert "prompt tokens)" in line and "store keeps them" in line
        await submit(pilot, "/compact")  # only the packed context and the last turn are left
        assert "nothing more to compact" in log_lines(app)[-1]
        await submit(pilot, "Floats too?")
        await finish(pilot)
        assert [a.text for a in app.screen.query(AssistantMessage)][-1] == "Yes, floats too."
        sent = engine.prompt_text(len(engine.prompts) - 1)
        assert "Question: What does add return?" in sent  # the root: packed context, whole
        assert "def add(a, b)" in sent
        assert "Earlier turns of this conversation are left out" in sent
        assert "add returns a + b (calc.py:2)." not in sent and "<tool_response>" not in sent
        assert "What does it take?" in sent and "It takes two numbers." in sent
        assert len(engine.prompts[-1]) < full
        # the store keeps every message of the turns left out, unchanged
        (messages, calls), (kept_messages, kept_calls) = stored(store, sid), kept
        assert messages[: len(kept_messages)] == kept_messages and calls == kept_calls
        assert len(messages) == len(kept_messages) + 2 and len(calls) == 1
        assert store.messages(sid)[-1].timings["compaction"] == {"turns": 1, "results": 1}


async def test_a_turn_past_the_window_says_in_the_log_what_it_left_out(tokenizer_path, repo, store):
    answer = "The add function returns the sum of its two arguments, a and b. " * 12
    engine = scripted(tokenizer_path, [answer] * 8, template=None, window=1024)
    app = AgentApp(repo=str(repo), engine_factory=lambda model: engine, store=store)
    app.params = type(app.params)(max_tokens=100)
    async with app.run_test(size=SIZE) as pilot:
        for i in range(1, 8):
            await submit(pilot, f"Question {i}?")
            await finish(pilot)
            assert not any("longer than the model's window" in x for x in log_lines(app))
        said = [x for x in log_lines(app) if x.startswith("context: left out")]
        assert said and "1,024-token window" in said[0]
        assert len(app.screen.query(AssistantMessage)) == 7
        assert len(store.messages(app.session.id)) == 2 + 1 + 6 * 2
        assert all(len(ids) + 100 <= 1024 for ids in engine.prompts)
