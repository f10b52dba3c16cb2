"""A turn's usage record: its prompt and answer tokens, timings and speculation, as `ask
--json` prints it and the session store keeps it."""

from __future__ import annotations


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
        **speculation_usage(stats),
    }


def speculation_usage(stats) -> dict:
    """Speculative decoding's per-request numbers, when a step of the request speculated."""
    spec = getattr(stats, "speculation", None)
    if spec is None or not spec.steps:
        return {}
    return {"speculation": {
        "steps": spec.steps, "drafted": spec.drafted, "accepted": spec.accepted,
        "mean_accepted": round(spec.mean_accepted, 2),
        "acceptance_rate": round(spec.acceptance_rate, 3),
        "proposer_time_share": round(spec.propose_s / stats.total_s, 3) if stats.total_s else 0.0,
    }}  # fmt: skip
