"""bench.serve_load over a tiny random-weights model: `generate` and a real `agentctx serve`
process get the same prompts, every client's tokens are counted, and the JSON holds each
round."""

from __future__ import annotations

import json
from pathlib import Path

from bench import serve_load
from tests.reliability.tiny_chat_model import tiny_chat_model


def test_prompts_are_fixed_per_seed_and_distinct_per_client():
    a, b = serve_load.prompts(3, 20, 49152, seed=4), serve_load.prompts(3, 20, 49152, seed=4)
    assert a == b and len({tuple(p) for p in a}) == 3
    assert all(len(p) == 20 and min(p) >= 100 and max(p) < 30000 for p in a)


def test_serve_and_generate_rounds(default_checkpoint, tmp_path, capsys):
    model = tiny_chat_model(tmp_path / "tiny", Path(default_checkpoint[0]))
    out = tmp_path / "load.json"
    rc = serve_load.main(["--model", model, "--device", "cpu", "--clients", "1", "3",
                          "--prompt-tokens", "24", "--max-tokens", "5", "--repeats", "1", "--generate",
                          "--logs", str(tmp_path), "--json", str(out)])  # fmt: skip
    assert rc == 0
    rounds = json.loads(out.read_text())["rounds"]
    assert [(r["server"], r["clients"]) for r in rounds] == [
        ("generate", 1),
        ("generate", 3),
        ("agentctx serve", 1),
        ("agentctx serve", 3),
    ]
    assert [r["completion_tokens"] for r in rounds] == [5, 15, 5, 15]  # ignore_eos: all of them
    assert all(r["tok_s"] > 0 and 0 < r["ttft_mean_s"] <= r["ttft_max_s"] for r in rounds)
    text = capsys.readouterr().out
    assert "HTTP cost at 3 clients" in text and "| agentctx serve | 3 |" in text
