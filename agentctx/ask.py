"""`agentctx ask`: one turn of a conversation about a repository, stored as a session.

A new session packs the repository into its first user message; a follow-up (`-c`, or
`--session NAME`) sends the stored turns again plus the new question, so the prompt of turn
N+1 starts with exactly the tokens of turn N.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentctx.agent import DEFAULT_MAX_STEPS, TOOL_PROMPTS, with_tool_prompt  # noqa: F401
from agentctx.packing import MAP_SHARE, PackedContext, pack_repository, summary_line
from agentctx.turn_usage import usage_of

SYSTEM_PROMPT = (
    "You are agentctx, an assistant that answers questions about a code repository. "
    "The repository is given as a map of all its files (each with its classes and functions "
    "as name:line), then the files most relevant to the question with line numbers. Answer "
    "from them, briefly, and cite files as path:line."
)
BOOK_SYSTEM_PROMPT = (
    "You are agentctx, an assistant that answers questions about a book. Chapters of the "
    "book are given with their line numbers. Answer from them, briefly, and cite lines as "
    "'line N' or chapters by title."
)
FOLLOW_UP_RESERVE = 1024  # tokens a new session leaves free for later turns
# Tokens a new session also leaves free for tool results, when the model takes tools: a
# read_file of a few hundred lines, a grep's matches.
TOOL_RESULT_RESERVE = 4096


@dataclass(slots=True)
class TurnResult:
    answer: str
    finish_reason: str
    usage: dict
    packed: PackedContext | None = None
    steps: list = field(default_factory=list)  # agentctx.agent.ToolStep: tool calls first
    token_ids: list[int] | None = None  # the answer's generated ids, when its text is them


def first_messages(packed: PackedContext, question: str, kind: str = "repo") -> list[dict]:
    book = kind == "book"
    label = "Book chapters" if book else "Repository files"
    user = f"{label}:\n\n{packed.text}\n\nQuestion: {question}"
    system = BOOK_SYSTEM_PROMPT if book else SYSTEM_PROMPT
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def pack_for(engine, root, question, max_tokens, context_tokens, kind="repo") -> PackedContext:
    """Pack within the window, leaving room for the prompt around the packed text (the tool
    schemas included), the answer, a follow-up and, for a model that takes tools, their
    results."""
    from agentctx.agent import engine_tool_format
    from engine import ContextTooLongError
    from tools.registry import BOOK_TOOLS, REPO_TOOLS, schemas

    takes_tools = engine_tool_format(engine) is not None
    tools = schemas(BOOK_TOOLS if kind == "book" else REPO_TOOLS) if takes_tools else None
    empty = first_messages(PackedContext("", [], [], 0, None), question, kind)
    overhead = len(engine.chat_tokens(empty, tools=tools)) + 16
    if overhead >= engine.max_model_len:
        raise ContextTooLongError(overhead, engine.max_model_len, what="the question")
    reserve = max_tokens + FOLLOW_UP_RESERVE + (TOOL_RESULT_RESERVE if takes_tools else 0)
    budget = engine.max_model_len - overhead - reserve
    if context_tokens:
        budget = min(budget, context_tokens)
    if kind == "book":
        from agentctx.book_packing import pack_book

        return pack_book(root, question, engine.count_tokens, max(budget, 0))
    # the map's budget leaves the question out: the map, the prompt's prefix, is then the
    # same for every question, and a second question on the repository reuses its KV
    room = engine.max_model_len - reserve - len(engine.chat_tokens(empty[:1], tools=tools))
    map_budget = int(min(room, context_tokens or room) * MAP_SHARE)
    return pack_repository(root, question, engine.count_tokens, max(budget, 0),
                           map_budget=max(map_budget, 0), cap_overview=not context_tokens)  # fmt: skip


@dataclass(slots=True)
class TurnLinks:
    """What a running turn is tied to besides its output: `session`, an engine session
    (engine.open_session) whose pinned KV the steps reuse; `record`, an
    agentctx.turn_record.TurnRecord that stores the answer as it streams; `on_stream`,
    called with each step's stream, so the caller can cancel it; `check`, whether an
    answer about a repository that its files contradict is asked for once more
    (agentctx.answer_check)."""

    session: Any = None
    record: Any = None
    on_stream: Callable[[Any], None] | None = None
    check: bool = False


def run_turn(
    engine,
    messages: list[dict],
    params,
    output,
    root: str | None = None,
    kind: str = "repo",
    max_steps: int = DEFAULT_MAX_STEPS,
    links: TurnLinks | None = None,
) -> TurnResult:
    """One turn: stream the answer to `output`, calling tools first when the model's chat
    template takes them (see agentctx.agent). Ctrl-C cancels generation; the partial answer
    is kept and KeyboardInterrupt is raised again with it attached (`.partial`). A stream
    cancelled from another thread (the TUI's Esc) ends the turn with reason "cancelled".
    `links`: the engine session, the record, the stream callback and the answer check
    (TurnLinks)."""
    from agentctx.agent import (
        ANSWER_NOW,
        ToolStep,
        VisibleText,
        after_step,
        assistant_message,
        call_counts,
        check_calls,
        parse_tool_calls,
        question_of,
        refuse_calls,
        run_tools,
        tool_messages,
    )
    from agentctx.answer_check import SETTLED, revise
    from agentctx.compaction import Compaction, compact_to_fit
    from engine import ContextTooLongError

    links = links or TurnLinks()
    session, record, on_stream = links.session, links.record, links.on_stream
    fmt, names, tools = turn_tools(engine, root, kind, max_steps)
    convo, steps, completion, ttft = list(messages), [], 0, None
    question, final = question_of(messages), False
    if fmt:
        convo = with_tool_prompt(convo, kind, fmt)
    retried = False  # a step that had to be the answer but only called tools, asked again
    reprompted = False  # an empty answer after tool results, asked again
    checking, revision = links.check and kind == "repo", None  # agentctx.answer_check
    for step_no in range(max_steps + 4):
        ids = engine.chat_tokens(convo, tools=tools)
        if step_no and len(ids) + params.max_tokens > engine.max_model_len:  # tool results
            _, convo = compact_to_fit(
                convo, lambda c: len(engine.chat_tokens(c, tools=tools)), engine.max_model_len,
                params.max_tokens, Compaction(), output,
            )  # fmt: skip
            ids = engine.chat_tokens(convo, tools=tools)
        if len(ids) >= engine.max_model_len:
            raise ContextTooLongError(len(ids), engine.max_model_len, what="the conversation")
        stream = (session or engine).stream(ids, params)
        if on_stream is not None:
            on_stream(stream)
        visible, stats, reason = VisibleText(fmt, names), None, "cancelled"
        try:
            for event in stream:
                if event.kind == "prefill":
                    output.prefill(event.prefilled, event.prompt_tokens)
                elif event.kind == "token" and event.text:
                    shown = visible.feed(event.text)
                    if shown:
                        output.text(shown)
                    if record is not None:
                        record.stream(lambda s=stream: parse_tool_calls(s.text, fmt, names)[0])
                elif event.kind == "done":
                    stats, reason = event.stats, event.finish_reason or ""
        except KeyboardInterrupt as e:
            stream.cancel()
            content, _ = parse_tool_calls(stream.text, fmt, names)
            usage = usage_of(None, len(ids))
            usage["finish_reason"] = "interrupted"
            e.partial = TurnResult(content, "interrupted", usage, steps=steps)
            raise
        content, calls = parse_tool_calls(stream.text, fmt, names)
        rest = visible.end(content)  # text held back in case it began a call
        if rest:
            output.text(rest)
        if stats is not None:
            completion += stats.completion_tokens
            ttft = stats.ttft_s if ttft is None else ttft
        must_answer = final or step_no >= max_steps
        only_calls = calls and not content.strip() and reason != "cancelled"
        if must_answer and only_calls and question and not retried:
            # once: the calls are refused and the question asked again
            retried = True
            step = ToolStep(content, refuse_calls(calls, names, fmt))
            steps.append(step)
            step.after = ANSWER_NOW.format(question=question)
            convo += [assistant_message(step), *tool_messages(step),
                      {"role": "user", "content": step.after}]  # fmt: skip
            for call in step.calls:
                output.tool_call(call)
                output.tool_result(call)
            if record is not None:
                record.step(step)
            continue
        empty = not content.strip() and not calls and reason not in ("cancelled", "length")
        if empty and any(s.calls for s in steps) and question and not reprompted:
            # once: an empty answer after tool results (the model ended its turn at once)
            # is asked for again in words
            reprompted = True
            convo += [{"role": "assistant", "content": ""},
                      {"role": "user", "content": ANSWER_NOW.format(question=question)}]  # fmt: skip
            continue
        if checking and revision is None and reason == "stop" and not calls and question:
            revision = revise(content, question, root, steps, convo, output, record)
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
            usage = usage_of(stats, len(ids))
            if stats is not None and steps:
                usage.update(completion_tokens=completion, ttft_s=round(ttft, 4))
            if steps:
                usage["steps"] = len(steps) + 1
            if revision is not None:
                usage.update(revision.usage())
            if fmt:
                made = [c for s in steps for c in s.calls]
                usage.update(call_counts(made + (calls if reason == "step_limit" else [])))
            kv_stats = getattr(engine, "kv_stats", None)
            if kv_stats is not None:  # where the context's KV lives (the meter shows it)
                usage.update(kv_stats())
            reuse = getattr(session, "last_reuse", None)
            if reuse is not None and reuse.diverged:
                usage["diverged_at"] = reuse.common_tokens  # the template re-rendered a turn
            # stored with the turn (its timings) and in --json's usage record
            usage["finish_reason"] = "interrupted" if reason == "cancelled" else reason
            ids = answer_ids(engine, stream, content) if reason != "cancelled" else None
            return TurnResult(content, reason, usage, steps=steps, token_ids=ids)
        step = ToolStep(content, calls)
        earlier = [c for s in steps for c in s.calls]
        run_tools(root, step, output, step_no == max_steps - 1, names, fmt, earlier)
        steps.append(step)
        convo += [assistant_message(step), *tool_messages(step)]
        step.after, final = after_step(step, question, step_no == max_steps - 1)
        if step.after:
            convo.append({"role": "user", "content": step.after})
        if record is not None:
            record.step(step)
    raise AssertionError("unreachable")  # the loop returns by step max_steps + 3


def turn_tools(engine, root, kind: str, max_steps: int):
    """(format, names, schemas) of the tools a turn offers; no format nor schemas: none."""
    from agentctx.agent import engine_tool_format
    from tools.registry import BOOK_TOOLS, REPO_TOOLS, schemas

    fmt = engine_tool_format(engine) if root and max_steps > 0 else None
    names = BOOK_TOOLS if kind == "book" else REPO_TOOLS
    return fmt, names, schemas(names) if fmt else None


def prompt_tokens(engine, messages: list[dict], root, kind: str, max_steps: int) -> int:
    """The tokens of a turn's first prompt over `messages`, as run_turn renders it."""
    fmt, _, tools = turn_tools(engine, root, kind, max_steps)
    convo = with_tool_prompt(messages, kind, fmt) if fmt else messages
    return len(engine.chat_tokens(convo, tools=tools))


def answer_ids(engine, stream, content: str) -> list[int] | None:
    """The ids the answer was generated as, without the end-of-turn id that closed it,
    when they decode to exactly its stored text (not so for a stop string's tokens or
    a replaced text); else None."""
    tokenizer, ids = getattr(engine, "tokenizer", None), list(getattr(stream, "token_ids", []))
    if ids and ids[-1] in getattr(engine, "eos_token_ids", ()):
        ids.pop()
    if not ids or tokenizer is None or tokenizer.decode(ids, skip_special_tokens=True) != content:
        return None
    return ids


def history_messages(store, session_id: str) -> list[dict]:
    """The stored turns as chat messages, to send again before a follow-up question:
    assistant steps that called tools come back with their calls and results, so the
    template renders the conversation as the model saw it. An answer stored with its
    generated ids carries them ("token_ids": engine.runtime.chat_ids), so the prompt holds
    those ids, whose KV the session has, and not its text tokenized again."""
    from collections import defaultdict

    from agentctx.agent import ToolCallRecord, ToolStep, assistant_message, tool_messages
    from agentctx.compaction import KEY

    calls = defaultdict(list)
    for t in store.tool_calls(session_id):
        calls[t.message_id].append(ToolCallRecord(t.name, t.arguments, t.result, t.error))
    out: list[dict] = []
    for m in store.messages(session_id):
        if calls.get(m.id):
            step = ToolStep(m.content, calls[m.id])
            out += [assistant_message(step), *tool_messages(step)]
        elif m.content:
            out.append({"role": m.role, "content": m.content})
            if m.token_ids and m.role == "assistant":
                out[-1]["token_ids"] = m.token_ids
        if out and m.timings and KEY in m.timings:  # what the turn's prompt left out
            out[-1][KEY] = m.timings[KEY]
    return out


def new_session_messages(
    engine, root: str, question: str, params, context_tokens, output, kind: str = "repo",
    show_packing: bool = False,
):  # fmt: skip
    """The first turn's messages, and what was packed. The summary line goes to `output`
    (with the manifest as data where it takes it: the --json info event), then any warning
    and, with show_packing, the whole manifest. Nothing packed from a book is an error."""
    from agentctx.packing_report import manifest_data, report_lines, stored_manifest
    from tools.errors import ToolError

    packed = pack_for(engine, root, question, params.max_tokens, context_tokens, kind)
    summary = summary_line(packed, "chapter" if kind == "book" else "file")
    with_data = getattr(output, "packing", None)
    if with_data is not None:
        with_data(summary, manifest_data(packed))
    else:
        output.info(summary)
    if kind == "book" and not packed.files:
        raise ToolError(
            f"{packed.warnings[0] if packed.warnings else 'nothing of the book fits'}: "
            "raise --context-tokens or use a model with a larger window"
        )
    for warning in packed.warnings:
        output.info(f"warning: {warning}")
    if show_packing:
        report = report_lines(*stored_manifest(packed), packed.tokens, packed.warnings)
        output.info("\n".join(report))
    return first_messages(packed, question, kind), packed


def open_engine_session(engine, session, output):
    """The engine session for a stored session (None: a new one), its KV restored from the
    session's snapshot when there is one that fits this engine."""
    import uuid

    if session is None:  # (no store import: the evaluation runs where sqlite-utils is not)
        return engine.open_session(f"new-{uuid.uuid4().hex}")
    from agentctx import kv_snapshots
    from sessions.store import is_session_id

    if not is_session_id(session.id):  # (imported before ids were checked: no snapshot)
        return engine.open_session(session.id)
    path = kv_snapshots.kv_path(session.id)
    if not path.exists():
        return engine.open_session(session.id)
    start = time.perf_counter()
    es = engine.open_session(session.id, snapshot=str(path))
    if es.snapshot_error:
        output.info(f"KV snapshot not used: {es.snapshot_error}; prefilling instead")
    else:
        kv_snapshots.touch(path)
        took = time.perf_counter() - start
        output.info(
            f"restored {es.restored_tokens:,} tokens of KV from the session's snapshot"
            f" in {took:.2f} s"
        )
    return es


def save_kv(es, session_id: str, output) -> None:
    """Save an engine session's KV as the stored session's snapshot, within the budget."""
    from agentctx import kv_snapshots
    from engine import EngineError
    from sessions.errors import StoreError
    from tools.errors import ToolError

    if not es.blocks:
        return
    try:
        path = kv_snapshots.kv_path(session_id)
        limit = kv_snapshots.budget()
        if limit == 0:
            return
        start = time.perf_counter()
        es.save(path)
        took = time.perf_counter() - start
        removed = kv_snapshots.prune(kv_snapshots.kv_dir(), limit)
    except (OSError, EngineError, ToolError, StoreError, kv_snapshots.BudgetError) as e:
        output.info(f"KV snapshot not saved: {e}")  # (ToolError: a bad config file)
        return
    if path in removed:
        output.info("KV snapshot not kept: it alone is over the disk budget (AGENTCTX_KV_BUDGET)")
    else:
        size = path.stat().st_size
        output.info(
            f"saved {es.num_cached_tokens:,} tokens of KV ({size / 1e6:,.0f} MB) in {took:.2f} s"
        )
