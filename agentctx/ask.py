"""`agentctx ask`: pack a repository, ask the model, stream the answer."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from agentctx.packing import PackedContext, pack_repository, summary_line
from agentctx.progress import Progress

SYSTEM_PROMPT = (
    "You are agentctx, an assistant that answers questions about a code repository. "
    "The repository's files are given with line numbers. Answer from them, briefly, "
    "and cite files as path:line."
)
ANSWER_RESERVE = 512  # tokens kept free for the answer


@dataclass(slots=True)
class AskResult:
    answer: str
    finish_reason: str
    packed: PackedContext
    stats: object


def build_messages(packed: PackedContext, question: str) -> list[dict]:
    user = f"Repository files:\n\n{packed.text}\n\nQuestion: {question}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def pack_for(
    engine, root: str, question: str, max_tokens: int, context_tokens: int | None
) -> PackedContext:
    empty = build_messages(PackedContext("", [], [], 0, None), question)
    overhead = len(engine.chat_tokens(empty)) + 16
    if overhead >= engine.max_model_len:
        from engine import ContextTooLongError

        raise ContextTooLongError(overhead, engine.max_model_len, what="the question")
    budget = engine.max_model_len - overhead - max_tokens
    if context_tokens:
        budget = min(budget, context_tokens)
    return pack_repository(root, question, engine.count_tokens, max(budget, 0))


def ask(
    engine, root: str, question: str, params, context_tokens: int | None = None, out=None
) -> AskResult:
    out = out or sys.stdout
    progress = Progress()
    packed = pack_for(engine, root, question, params.max_tokens, context_tokens)
    progress.line(summary_line(packed))
    stream = engine.chat_stream(build_messages(packed, question), params)
    stats, reason = None, "cancelled"
    try:
        for event in stream:
            if event.kind == "prefill":
                progress.prefill(event.prefilled, event.prompt_tokens)
                if event.prefilled >= event.prompt_tokens:
                    progress.end_prefill()
            elif event.kind == "token" and event.text:
                out.write(event.text)
                out.flush()
            elif event.kind == "done":
                stats, reason = event.stats, event.finish_reason or ""
    except KeyboardInterrupt:
        stream.cancel()
        out.write("\n")
        raise
    out.write("\n")
    out.flush()
    if stats is not None:
        progress.line(
            f"{stats.prompt_tokens} tokens in context ({stats.cached_tokens} reused), "
            f"time to first token {stats.ttft_s:.2f} s ({stats.prefill_tok_s:,.0f} tok/s prefill), "
            f"{stats.completion_tokens} tokens at {stats.decode_tok_s:.1f} tok/s"
        )
    return AskResult(stream.text, reason, packed, stats)
