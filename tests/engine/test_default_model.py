"""The real default model (SmolLM2-135M-Instruct Q4_1 GGUF): our engine against
transformers on the same dequantized weights."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, SamplingParams
from engine.loading.loader import resolve_source
from engine.runtime.llm_engine import prompt_logits

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(None, device="cpu", dtype="float32", weights="dense")


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    path = resolve_source(None).path  # the cached checkpoint the GGUF was converted into
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def chat_ids(engine: Engine, text: str) -> list[int]:
    return engine.chat_tokens([{"role": "user", "content": text}])


def test_logits_match_transformers(engine, hf_model):
    ids = chat_ids(engine, "Write a haiku about the sea, then explain what a haiku is.")
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    ours = prompt_logits(engine, ids)
    assert (ours - ref).abs().max().item() < 1e-4


def test_greedy_32_tokens_match_transformers(engine, hf_model):
    ids = chat_ids(engine, "Describe Paris, the capital of France, in a long paragraph.")
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[
            0, len(ids) :
        ]
    ours = engine.generate([ids], SamplingParams(max_tokens=32))[0]
    assert len(ours.token_ids) == 32  # no early EOS: all 32 tokens are compared
    assert ours.token_ids == ref.tolist()
    assert "Paris" in engine.decode(ours.token_ids)


def test_int4_weights_answer_like_dense(engine):
    int4 = Engine.load(None, device="cpu", weights="int4")
    assert type(int4.model.layers[0].mlp.down_proj).__name__ == "Int4Linear"
    ids = chat_ids(engine, "What is the capital of France?")
    dense = engine.generate([ids], SamplingParams(max_tokens=12))[0]
    quant = int4.generate([ids], SamplingParams(max_tokens=12))[0]
    assert "Paris" in dense.text and "Paris" in quant.text


def test_chat_stops_at_eos_and_streams_text(engine):
    stream = engine.chat_stream(
        [{"role": "user", "content": "Say hello."}], SamplingParams(max_tokens=64)
    )
    text = "".join(e.text for e in stream if e.kind == "token")
    assert text == stream.text and text.strip()
    assert stream.request.seq.finish_reason in ("stop", "length")


def test_stop_string_cuts_the_text(engine):
    ids = chat_ids(engine, "Count from 1 to 20, separated by commas.")
    full = engine.generate([ids], SamplingParams(max_tokens=40))[0].text
    assert "5" in full
    cut = engine.generate([ids], SamplingParams(max_tokens=40, stop=["5"]))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.index("5")]


def test_a_stop_string_ends_a_stream_with_its_done_event(engine):
    """A stop string ends the sequence after the scheduler listed the finished ones: the
    stream still gets its done event (it used to loop forever without one)."""
    import threading

    ids = chat_ids(engine, "Count from 1 to 20, separated by commas.")
    full = engine.generate([ids], SamplingParams(max_tokens=40))[0].text
    events = []
    stream = engine.stream(ids, SamplingParams(max_tokens=40, stop=["5"]))
    reader = threading.Thread(target=lambda: events.extend(stream), daemon=True)
    reader.start()
    reader.join(timeout=120)
    assert not reader.is_alive(), "the stream never ended"
    assert events[-1].kind == "done" and events[-1].finish_reason == "stop"
    assert stream.text == full[: full.index("5")]
