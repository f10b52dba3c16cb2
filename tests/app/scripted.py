"""An engine whose replies are scripted, for the agent loop's tests: no small model that
runs offline calls tools, so the model's side of a tool-calling turn is played from a
script. Everything else is real: the default model's tokenizer renders every prompt through
a chat template that takes tools (tests/app/tool_templates.py), the tools read a real git
repository, and turns are stored in a real SQLite file."""

from __future__ import annotations

from engine.runtime.requests import GenerationStats, StreamEvent


class ScriptedStream:
    def __init__(self, engine: ScriptedEngine, ids: list[int], reply: str,
                 cut: int | None = None) -> None:  # fmt: skip
        self.engine, self.ids, self.reply, self.cut = engine, ids, reply, cut
        self.text = ""
        self.cancelled = False

    def __iter__(self):
        n = len(self.ids)
        yield StreamEvent("prefill", prefilled=n, prompt_tokens=n)
        pieces = [
            self.engine.tokenizer.decode([t]) for t in self.engine.tokenizer.encode(self.reply)
        ]
        cut = self.cut is not None and len(pieces) > self.cut
        pieces = pieces[: self.cut] if cut else pieces
        for piece in pieces:
            if self.cancelled:
                break
            self.text += piece
            yield StreamEvent("token", text=piece)
            if self.engine.cancel_after is not None and len(self.text) >= self.engine.cancel_after:
                self.cancel()
        reason = "cancelled" if self.cancelled else "length" if cut else "stop"
        stats = GenerationStats(prompt_tokens=n, completion_tokens=len(pieces), ttft_s=0.01)
        yield StreamEvent("done", finish_reason=reason, stats=stats)

    def cancel(self) -> None:
        self.cancelled = True


class ScriptedEngine:
    """`replies` are the model's texts, one a step; `prompts` records each step's prompt."""

    def __init__(self, tokenizer, template: str, replies: list[str], max_model_len=8192):
        self.tokenizer = tokenizer
        self.tokenizer.chat_template = template
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.max_model_len = max_model_len
        self.cancel_after: int | None = None  # cancel a step once it has this many chars
        self.cuts: dict[int, int] = {}  # step -> tokens after which it ends as "length"

    def chat_tokens(self, messages, add_generation_prompt=True, tools=None):
        extra = {"tools": tools} if tools else {}
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, **extra
        )
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def stream(self, ids, params=None) -> ScriptedStream:
        self.prompts.append(list(ids))
        reply = self.replies.pop(0) if self.replies else "(no more replies)"
        return ScriptedStream(self, ids, reply, self.cuts.get(len(self.prompts) - 1))

    def open_session(self, session_id, messages=None, snapshot=None) -> ScriptedSession:
        return ScriptedSession(self)

    def prompt_text(self, step: int) -> str:
        return self.tokenizer.decode(self.prompts[step])


class ScriptedSession:
    """engine.open_session's stand-in: no KV to keep, every step streams from the script."""

    def __init__(self, engine: ScriptedEngine) -> None:
        self.engine = engine
        self.blocks: list[int] = []
        self.busy = False
        self.last_reuse = None
        self.snapshot_error = None

    def stream(self, ids, params=None) -> ScriptedStream:
        return self.engine.stream(ids, params)

    def close(self) -> None:
        pass
