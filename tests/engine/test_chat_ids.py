"""engine.runtime.chat_ids through Engine.chat_tokens: a pinned answer's ids stay in the
prompt exactly, in place of its re-tokenized text; with no pinned message the prompt is
the template's own tokens. A real tokenizer (SmolLM2's) and real templates: its own, and
the two tool-taking ones the agent tests use."""

from __future__ import annotations

import pytest

from engine import Engine
from tests.app.tool_templates import HERMES, JSON
from tests.reliability.tiny_chat_model import tiny_chat_model

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]  # fmt: skip
# (template, tools): None is the tokenizer's own template
TEMPLATES = [(None, None), (HERMES, None), (HERMES, TOOLS), (JSON, None), (JSON, TOOLS)]
IDS = ["own", "hermes", "hermes-tools", "json", "json-tools"]
QUESTION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What does greet return?"},
]
ANSWER = "It returns\n\n`Hello, name!`"
FOLLOW_UP = {"role": "user", "content": "And where is it tested?"}


@pytest.fixture(scope="module")
def engine(default_checkpoint, tmp_path_factory) -> Engine:
    model = tiny_chat_model(tmp_path_factory.mktemp("tiny"), default_checkpoint[0])
    return Engine.load(model, device="cpu", dtype="float32")


@pytest.fixture(params=TEMPLATES, ids=IDS)
def template(engine, request):
    own = engine.tokenizer.chat_template
    chat_template, tools = request.param
    engine.tokenizer.chat_template = chat_template or own
    yield tools
    engine.tokenizer.chat_template = own


def template_ids(engine: Engine, messages: list[dict], tools) -> list[int]:
    """What chat_tokens gave before pinned ids: the template's own tokens."""
    extra = {"tools": tools} if tools else {}
    out = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **extra
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def other_ids(engine: Engine, text: str) -> list[int]:
    """Ids of `text` that are not the ones encoding it gives: each character on its own,
    as a model may generate them."""
    tok = engine.tokenizer
    ids = [i for ch in text for i in tok(ch, add_special_tokens=False)["input_ids"]]
    assert tok.decode(ids) == text and ids != tok(text, add_special_tokens=False)["input_ids"]
    return ids


def conversation(answer: dict) -> list[dict]:
    return [*QUESTION, answer, FOLLOW_UP]


def test_without_pinned_ids_the_prompt_is_the_templates_own(engine, template):
    for messages in (QUESTION, conversation({"role": "assistant", "content": ANSWER})):
        assert engine.chat_tokens(messages, tools=template) == template_ids(
            engine, messages, template
        )


def test_pinned_ids_that_encoding_gives_render_the_same_prompt(engine, template):
    text_ids = engine.tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    pinned = {"role": "assistant", "content": ANSWER, "token_ids": text_ids}
    plain = {"role": "assistant", "content": ANSWER}
    assert engine.chat_tokens(conversation(pinned), tools=template) == template_ids(
        engine, conversation(plain), template
    )


def test_pinned_ids_stay_a_prefix_where_the_text_would_not(engine, template):
    ids = other_ids(engine, ANSWER)
    turn1 = engine.chat_tokens(QUESTION, tools=template)  # the answer was generated after it
    pinned = engine.chat_tokens(conversation({"role": "assistant", "content": ANSWER,
                                              "token_ids": ids}), tools=template)  # fmt: skip
    plain = template_ids(engine, conversation({"role": "assistant", "content": ANSWER}), template)
    assert pinned[: len(turn1) + len(ids)] == turn1 + ids
    assert plain[: len(turn1)] == turn1 and plain[len(turn1) : len(turn1) + len(ids)] != ids
    # after the answer, the same tokens as the text's rendering
    text_len = len(engine.tokenizer(ANSWER, add_special_tokens=False)["input_ids"])
    assert pinned[len(turn1) + len(ids) :] == plain[len(turn1) + text_len :]


def test_two_pinned_answers_each_keep_their_ids(engine):
    first, second = other_ids(engine, ANSWER), other_ids(engine, "In test_greet.py.")
    messages = [*QUESTION, {"role": "assistant", "content": ANSWER, "token_ids": first},
                FOLLOW_UP, {"role": "assistant", "content": "In test_greet.py.",
                            "token_ids": second}]  # fmt: skip
    ids = engine.chat_tokens(messages)
    at = len(engine.chat_tokens(QUESTION))
    assert ids[at : at + len(first)] == first
    at = len(engine.chat_tokens(messages[:4]))  # (the first pinned too)
    assert ids[at : at + len(second)] == second


def test_a_template_that_changes_the_content_gets_the_text(engine):
    """A sentinel the template does not render as it is (here: upper-cased) cannot be
    found: the prompt is then the template's rendering of the text."""
    own = engine.tokenizer.chat_template
    engine.tokenizer.chat_template = own.replace("message['content']", "message['content'].upper()")
    try:
        messages = conversation({"role": "assistant", "content": ANSWER,
                                 "token_ids": other_ids(engine, ANSWER)})  # fmt: skip
        assert engine.chat_tokens(messages) == template_ids(engine, messages, None)
    finally:
        engine.tokenizer.chat_template = own
