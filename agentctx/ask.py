"""`agentctx ask`: one turn of a conversation about a repository, stored as a session.

A new session packs the repository into its first user message; a follow-up (`-c`, or
`--session NAME`) sends the stored turns again plus the new question, so the prompt of turn
N+1 starts with exactly the tokens of turn N.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentctx.packing import PackedContext, pack_repository, summary_line

SYSTEM_PROMPT = (
    "You are agentctx, an assistant that answers questions about a code repository. "
    "The repository's files are given with line numbers. Answer from them, briefly, "
    "and cite files as path:line."
)
BOOK_SYSTEM_PROMPT = (
    "You are agentctx, an assistant that answers questions about a book. Chapters of the "
    "book are given with their line numbers. Answer from them, briefly, and cite lines as "
    "'line N' or chapters by title."
)
FOLLOW_UP_RESERVE = 1024  # tokens a new session leaves free for later turns


@dataclass(slots=True)
class TurnResult:
    answer: str
    finish_reason: str
    usage: dict
    packed: PackedContext | None = None


def first_messages(packed: PackedContext, question: str, kind: str = "repo") -> list[dict]:
    book = kind == "book"
    label = "Book chapters" if book else "Repository files"
    user = f"{label}:\n\n{packed.text}\n\nQuestion: {question}"
    system = BOOK_SYSTEM_PROMPT if book else SYSTEM_PROMPT
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def pack_for(engine, root, question, max_tokens, context_tokens, kind="repo") -> PackedContext:
    from engine import ContextTooLongError

    empty = first_messages(PackedContext("", [], [], 0, None), question, kind)
    overhead = len(engine.chat_tokens(empty)) + 16
    if overhead >= engine.max_model_len:
        raise ContextTooLongError(overhead, engine.max_model_len, what="the question")
    budget = engine.max_model_len - overhead - max_tokens - FOLLOW_UP_RESERVE
    if context_tokens:
        budget = min(budget, context_tokens)
    if kind == "book":
        from agentctx.book_packing import pack_book

        return pack_book(root, question, engine.count_tokens, max(budget, 0))
    return pack_repository(root, question, engine.count_tokens, max(budget, 0))


def run_turn(engine, messages: list[dict], params, output) -> TurnResult:
    """Stream one answer to `output`. Ctrl-C cancels generation; the partial answer is kept
    and KeyboardInterrupt is raised again with it attached (`.partial`)."""
    from engine import ContextTooLongError

    ids = engine.chat_tokens(messages)
    if len(ids) >= engine.max_model_len:
        raise ContextTooLongError(len(ids), engine.max_model_len, what="the conversation")
    stream = engine.stream(ids, params)
    stats, reason = None, "cancelled"
    try:
        for event in stream:
            if event.kind == "prefill":
                output.prefill(event.prefilled, event.prompt_tokens)
            elif event.kind == "token" and event.text:
                output.text(event.text)
            elif event.kind == "done":
                stats, reason = event.stats, event.finish_reason or ""
    except KeyboardInterrupt as e:
        stream.cancel()
        e.partial = TurnResult(stream.text, "interrupted", usage_of(None, len(ids)))
        raise
    result = TurnResult(stream.text, reason, usage_of(stats, len(ids)))
    return result


def usage_of(stats, prompt_tokens: int) -> dict:
    if stats is None:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": None}
    return {
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "completion_tokens": stats.completion_tokens,
        "ttft_s": round(stats.ttft_s, 4),
        "prefill_tok_s": round(stats.prefill_tok_s, 1),
        "decode_tok_s": round(stats.decode_tok_s, 2),
    }


def new_session_messages(
    engine, root: str, question: str, params, context_tokens, output, kind: str = "repo"
):
    packed = pack_for(engine, root, question, params.max_tokens, context_tokens, kind)
    output.info(summary_line(packed, "chapter" if kind == "book" else "file"))
    return first_messages(packed, question, kind), packed


def save_turn(store, session, name, root, kind, model, messages, packed, result, status):
    """Store what this turn added: for a new session its system and user messages and the
    packing manifest, for a follow-up the new question; then the answer."""
    with store.transaction():
        if session is None:
            session = store.create(root, kind, model or "default", name=name)
            for m in messages:
                store.add_message(session.id, m["role"], m["content"])
            if packed is not None:
                store.add_manifest(
                    session.id,
                    [{"path": f.path, "tokens": f.tokens} for f in packed.files],
                    [
                        {"path": f.path, "tokens": f.tokens, "reason": f.reason}
                        for f in packed.omitted
                    ],
                    tokens=packed.tokens,
                    commit_sha=packed.commit,
                )
        else:
            store.add_message(session.id, "user", messages[-1]["content"])
        store.add_message(
            session.id,
            "assistant",
            result.answer,
            tokens=result.usage.get("completion_tokens"),
            status=status,
            timings=result.usage,
        )
    return store.get(session.id)
