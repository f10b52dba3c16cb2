"""A scripted engine (tests/app/scripted.py) that takes its time: it prefills in two halves
and waits `delay` seconds before each event, as a model on a busy CPU does, so that a test
can watch a turn while it runs and time how fast it stops. `fail_at`: the step (0, 1, ...)
whose stream raises half way through its prefill."""

from __future__ import annotations

import time

from engine.runtime.requests import StreamEvent
from tests.app.scripted import ScriptedEngine, ScriptedStream


class SlowStream(ScriptedStream):
    def __iter__(self):
        engine, n = self.engine, len(self.ids)
        time.sleep(engine.delay)
        yield StreamEvent("prefill", prefilled=n // 2, prompt_tokens=n)
        time.sleep(engine.delay)
        if engine.fail_at == len(engine.prompts) - 1:
            raise RuntimeError("the scripted engine failed")
        for event in super().__iter__():
            time.sleep(engine.delay)
            yield event


class SlowEngine(ScriptedEngine):
    def __init__(self, tokenizer, template: str, replies: list[str], delay: float, **kw):
        super().__init__(tokenizer, template, replies, **kw)
        self.delay = delay
        self.fail_at: int | None = None

    def stream(self, ids, params=None) -> SlowStream:
        self.prompts.append(list(ids))
        reply = self.replies.pop(0) if self.replies else "(no more replies)"
        return SlowStream(self, ids, reply)
