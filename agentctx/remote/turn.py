"""One turn against a remote model: the agent loop of agentctx.ask.run_turn with each step
a streamed chat completion. The tools go in the API's `tools` field and come back as
`tool_calls`, which run with the agent loop's own checks and tools (agentctx.agent); a
server that leaves a call in the text (no tool parser) has it parsed there, as the embedded
engine does. The result is the embedded engine's TurnResult, its usage from the server's
usage chunks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agentctx.agent import (
    ANSWER_NOW,
    ToolStep,
    after_step,
    assistant_message,
    call_counts,
    check_calls,
    question_of,
    refuse_calls,
    run_tools,
    tool_messages,
    with_tool_prompt,
)
from agentctx.answer_check import SETTLED, revise
from agentctx.ask import TurnResult


@dataclass
class StepReply:
    """One step's answer: its text, parsed calls, finish reason ("stop", "length",
    "tool_calls", "cancelled") and what the server said it cost."""

    content: str
    calls: list
    reason: str
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    total_s: float = 0.0


@dataclass
class Totals:
    replies: list[StepReply] = field(default_factory=list)

    def usage(self, last: StepReply, prompt_tokens: int) -> dict:
        """The turn's usage as the embedded engine reports it: the last step's prompt, the
        completion tokens over all steps, the first token's time; the rates are the last
        step's as seen from here (0 where the server said nothing to time them by)."""
        done = [r.completion_tokens for r in self.replies if r.completion_tokens is not None]
        prompt = last.prompt_tokens or prompt_tokens
        cached = last.cached_tokens or 0  # (a server that does not say: none counted)
        first = next((r.ttft_s for r in self.replies if r.ttft_s is not None), 0.0)
        ttft, decode_s = last.ttft_s or 0.0, last.total_s - (last.ttft_s or 0.0)
        return {
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": sum(done) if done else None,
            "ttft_s": round(first, 4),
            "prefill_tok_s": round((prompt - cached) / ttft, 1) if ttft > 0 else 0.0,
            "decode_tok_s": round(last.completion_tokens / decode_s, 2)
            if last.completion_tokens and decode_s > 0
            else 0.0,
        }


def turn_prompt(backend, turn, messages: list[dict]) -> tuple:
    """(tool format or None, the tools' names, their schemas or None, the first step's
    messages): what a turn over `messages` sends."""
    from tools.registry import BOOK_TOOLS, REPO_TOOLS, schemas

    fmt = backend.tool_fmt if turn.root and turn.max_steps > 0 else None
    names = BOOK_TOOLS if turn.kind == "book" else REPO_TOOLS
    tools = schemas(names) if fmt else None
    convo = with_tool_prompt(messages, turn.kind, fmt) if fmt else list(messages)
    return fmt, names, tools, convo


def fit_step(backend, convo: list[dict], tools, turn, output) -> tuple[list[dict], int | None]:
    """(a step's messages as sent, their tokens where counted here): where they and the
    answer's room would overflow the window, with the earlier turns' tool results, then the
    earlier turns, left out (as agentctx.ask.run_turn does mid-turn; the turn's own steps
    stay)."""
    from agentctx.compaction import Compaction, compact_to_fit

    count = lambda messages: backend.counter.chat_count(messages, tools)
    room, tokens = turn.params.max_tokens, count(convo)
    if tokens + room <= backend.window:
        return convo, tokens
    return compact_to_fit(convo, count, backend.window, room, Compaction(), output)[1], None


def run_remote_turn(backend, turn, output, links) -> TurnResult:
    """turn (agentctx.conversation.Turn) on `backend` (RemoteBackend); links: TurnLinks."""
    fmt, names, tools, convo = turn_prompt(backend, turn, turn.messages)
    steps, totals, max_steps = [], Totals(), turn.max_steps
    question, final, retried = question_of(turn.messages), False, False
    checking, revision = links.check and turn.kind == "repo", None  # agentctx.answer_check
    for step_no in range(max_steps + 3):
        tokens = None
        if step_no:  # a tool step's results may fill the window: leave earlier turns out
            convo, tokens = fit_step(backend, convo, tools, turn, output)
        prompt_tokens = backend.check_room(convo, tools, tokens)
        try:
            reply = backend.step(convo, tools, fmt, turn, output, links, prompt_tokens)
        except KeyboardInterrupt as e:
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": None,
                     "finish_reason": "interrupted"}  # fmt: skip
            e.partial = TurnResult(getattr(e, "step_text", ""), "interrupted", usage, steps=steps)
            raise
        totals.replies.append(reply)
        content, calls, reason = reply.content, reply.calls, reply.reason
        must_answer = final or step_no >= max_steps
        only_calls = calls and not content.strip() and reason != "cancelled"
        if must_answer and only_calls and question and not retried:
            retried = True  # once: the calls are refused and the question asked again
            step = ToolStep(content, refuse_calls(calls, names, fmt))
            steps.append(step)
            step.after = ANSWER_NOW.format(question=question)
            convo += [assistant_message(step), *tool_messages(step),
                      {"role": "user", "content": step.after}]  # fmt: skip
            for call in step.calls:
                output.tool_call(call)
                output.tool_result(call)
            if links.record is not None:
                links.record.step(step)
            continue
        if checking and revision is None and reason == "stop" and not calls and question:
            revision = revise(content, question, turn.root, steps, convo, output, links.record)
            if revision.faults:
                continue
        if revision is not None and revision.faults and reason in SETTLED and not calls:
            content = revision.settle(content, output)
            reason = "stop" if revision.kept_first else reason  # the first ended on its own
        if reason == "cancelled" or not calls or must_answer:
            if calls and reason != "cancelled":
                reason = "step_limit"
                content = content or "(stopped: the tool step limit was reached)"
                check_calls(ToolStep(content, calls), names, fmt)  # counted, not run
            usage = totals.usage(reply, prompt_tokens)
            if steps:
                usage["steps"] = len(steps) + 1
            if revision is not None:
                usage.update(revision.usage())
            if fmt:
                made = [c for s in steps for c in s.calls]
                usage.update(call_counts(made + (calls if reason == "step_limit" else [])))
            usage["backend"] = backend.name
            usage["finish_reason"] = "interrupted" if reason == "cancelled" else reason
            return TurnResult(content, reason, usage, steps=steps)
        step = ToolStep(content, calls)
        earlier = [c for s in steps for c in s.calls]
        run_tools(turn.root, step, output, step_no == max_steps - 1, names, fmt, earlier)
        steps.append(step)
        convo += [assistant_message(step), *tool_messages(step)]
        step.after, final = after_step(step, question, step_no == max_steps - 1)
        if step.after:
            convo.append({"role": "user", "content": step.after})
        if links.record is not None:
            links.record.step(step)
    raise AssertionError("unreachable")  # the loop returns by step max_steps + 2


def stream_step(chunks, output, record, visible, handle) -> tuple[object, float | None, bool]:
    """Feed a step's chunks to `output` (what `visible`, agentctx.tool_calls.VisibleText,
    lets show) and the record; (the assembly, seconds to the first text, cancelled)."""
    from agentctx.remote.chat_stream import ChatAssembly
    from agentctx.tool_calls import parse_tool_calls

    reply, start, first = ChatAssembly(), time.perf_counter(), None
    try:
        for chunk in chunks:
            if handle.cancelled:
                return reply, first, True
            added = reply.feed(chunk)
            if added:
                first = time.perf_counter() - start if first is None else first
                shown = visible.feed(added)
                if shown:
                    output.text(shown)
                if record is not None:
                    record.stream(lambda: parse_tool_calls(reply.content, visible.fmt,
                                                           visible.tools)[0])  # fmt: skip
    except KeyboardInterrupt as e:
        e.step_text = reply.content
        raise
    return reply, first, handle.cancelled
