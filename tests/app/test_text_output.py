"""What `ask` prints on stderr when an answer ends (agentctx.output.TextOutput)."""

from __future__ import annotations

import io

from agentctx.output import TextOutput

USAGE = {"prompt_tokens": 10, "cached_tokens": 0, "ttft_s": 0.1, "prefill_tok_s": 100.0,
         "completion_tokens": 32, "decode_tok_s": 5.0}  # fmt: skip


def ended(usage: dict) -> str:
    out, err = io.StringIO(), io.StringIO()
    text = TextOutput(out, err)
    text.text("An answer that")
    text.end(usage)
    return err.getvalue()


def test_an_answer_cut_by_max_tokens_says_so() -> None:
    err = ended({**USAGE, "finish_reason": "length"})
    assert "[the answer was cut at 32 tokens, the --max-tokens limit" in err


def test_an_answer_that_stopped_has_no_marker() -> None:
    for reason in ("stop", None):
        assert "was cut" not in ended({**USAGE, "finish_reason": reason})


def test_the_summary_gives_a_rate_only_where_there_is_one() -> None:
    assert "32 tokens at 5.0 tok/s;" in ended({**USAGE, "session": "s-1"})
    # one token (an answer cancelled at once): no "1 tokens at 0.0 tok/s"
    one = ended({**USAGE, "completion_tokens": 1, "decode_tok_s": 0.0, "session": "s-1"})
    assert "prefill), 1 token; session s-1" in one and "0.0 tok/s" not in one
