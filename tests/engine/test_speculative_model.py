"""Speculative decoding with the real default model in exact fp32 mode: each proposer gives
token for token the greedy output of plain decoding, on five prompts (code and prose) decoded
as one batch, over dense KV and over the tiered sparse cache; prompt lookup accepts several
tokens per verification where the answer repeats text."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import Engine, SamplingParams
from engine.config import EngineConfig
from engine.kv import SparseConfig
from engine.loading.default_model import default_model_path
from engine.spec.decoder import SpecConfig

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "engine" / "data"
# fixed texts: what these tests measure must not move when the README or the engine's own
# files are edited (the prompts below were once read from engine/sequence.py and
# engine/block_manager.py; these are those files as they were)
README_EXCERPT = (DATA / "readme_excerpt.md").read_text()
SEQUENCE_EXCERPT = (DATA / "sequence_excerpt.py.txt").read_text()
BLOCK_MANAGER_EXCERPT = (DATA / "block_manager_excerpt.py.txt").read_text()
PARAMS = SamplingParams(max_tokens=32, ignore_eos=True)


def load(sparse: bool, speculate: SpecConfig | None = None) -> Engine:
    cfg = EngineConfig(sparse=SparseConfig(budget_fraction=0.25) if sparse else None,
                       speculate=speculate)  # fmt: skip
    return Engine.load(None, device="cpu", dtype="float32", weights="dense", config=cfg)


def prompts(engine: Engine) -> list[list[int]]:
    seq_py = SEQUENCE_EXCERPT
    blocks = BLOCK_MANAGER_EXCERPT[:2500]
    readme = README_EXCERPT[:2000]
    asks = [
        f"{seq_py}\nCopy the method `append_token` of this file exactly.",
        f"{blocks}\nWhat does match_prefix return?",
        f"{readme}\nSummarise this in two sentences.",
        f"{readme}\nQuote the first sentence of this text.",
        "Write a Python function that returns the sum of a list of numbers.",
    ]
    return [engine.chat_tokens([{"role": "user", "content": a}]) for a in asks]


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "sparse"])
def reference(request):
    engine = load(request.param)
    batch = prompts(engine)
    return request.param, batch, [c.token_ids for c in engine.generate(batch, PARAMS)]


@pytest.mark.parametrize("mode", ["lookup", "self", "draft"])
def test_each_proposer_gives_the_greedy_tokens(reference, mode):
    sparse, batch, expected = reference
    name = f"draft:{default_model_path()}" if mode == "draft" else mode
    engine = load(sparse, SpecConfig(name, adaptive=False))  # draft every step: coverage
    got = engine.generate(batch, PARAMS)
    assert [c.token_ids for c in got] == expected
    stats = [c.stats.speculation for c in got]
    assert all(s is not None and s.steps > 0 for s in stats)
    if mode == "lookup":  # where the answer repeats text, several tokens per step
        assert max(s.mean_accepted for s in stats) > 2.0
    else:  # the same weights draft: most tokens are accepted
        assert sum(s.accepted for s in stats) / sum(s.drafted for s in stats) > 0.5


def test_lookup_gives_the_greedy_tokens_in_the_default_4bit_mode():
    """The product path: 4-bit weights, the CLI's repetition penalty, each prompt alone from
    a cold cache (a warm cache prefills the prompt's tail in other chunks, which the 4-bit
    mode's bf16 prefill can change), drafts every step."""
    engine = Engine.load(None, device="cpu")
    assert engine.weights_mode == "int4"
    params = SamplingParams(max_tokens=32, repetition_penalty=1.1)
    batch = prompts(engine)[2:]
    expected = []
    for p in batch:
        engine.block_manager.reset_prefix_cache()
        expected.append(engine.generate([p], params)[0].token_ids)
    from engine.spec.decoder import SpecDecoder, make_proposer

    for mode in ("lookup", "self", "lookup+self"):
        cfg = SpecConfig(mode, adaptive=False)
        engine.spec = SpecDecoder(engine.runner, engine.block_manager, cfg,
                                  make_proposer(cfg, engine.runner))  # fmt: skip
        for p, want in zip(batch, expected, strict=True):
            engine.block_manager.reset_prefix_cache()
            c = engine.generate([p], params)[0]
            assert c.token_ids == want and c.stats.speculation.steps > 0
