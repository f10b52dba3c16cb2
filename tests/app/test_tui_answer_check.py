"""The answer check in the TUI, driven with Pilot: an answer the repository's files
contradict stays in the log as it streamed, a line says why it is asked again, and the new
answer gets a block of its own (the scripted model's replies, a real store, a real git
repository)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentctx.tui.app import AgentApp
from agentctx.tui.widgets import AssistantMessage, LogLine
from engine.loading.loader import resolve_source
from tests.app.pilot_support import finish, submit
from tests.app.scripted import ScriptedEngine
from tests.app.tool_templates import HERMES

pytestmark = pytest.mark.anyio
WRONG = "The `plus` function, at calc.py:40."
RIGHT = "`add` returns a + b (calc.py:1-2)."


async def test_a_contradicted_answer_and_the_new_one_are_two_blocks(repo, store, agentctx_home):
    tok = AutoTokenizer.from_pretrained(resolve_source(None).path)
    scripted = ScriptedEngine(tok, HERMES, [WRONG, RIGHT])
    app = AgentApp(repo=str(repo), engine_factory=lambda model: scripted, store=store)
    async with app.run_test(size=(100, 30)) as pilot:
        await submit(pilot, "Which function adds two numbers?")
        await finish(pilot)
        assert [w.text for w in app.screen.query(AssistantMessage)] == [WRONG, RIGHT]
        (line,) = [w for w in app.screen.query(LogLine) if w.has_class("check")]
        assert str(line.render()).startswith("checked against the files: calc.py:40: calc.py")
        messages = store.messages(app.session.id)
    assert [m.content for m in messages if m.role == "assistant"] == [WRONG, RIGHT]
