"""The agent loop (agentctx.agent, agentctx.ask.run_turn): tool-call parsing, streaming
without the markup, tools run against a real git repository, the step limit, and turns
stored in and restored from a real SQLite store."""

from __future__ import annotations

import io
import json

import pytest
from transformers import AutoTokenizer

from agentctx.agent import (
    LIMIT_NOTE,
    VisibleText,
    parse_tool_calls,
    tool_format,
)
from agentctx.ask import history_messages, run_turn, save_turn
from agentctx.output import JsonOutput
from engine import SamplingParams
from engine.loader import resolve_source
from sessions.store import SessionStore
from tests.app.scripted import ScriptedEngine
from tests.app.tool_templates import HERMES, JSON


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def tokenizer_path(agentctx_home):
    return resolve_source(None).path  # the default model's converted checkpoint


def scripted(tokenizer_path, replies, template=HERMES) -> ScriptedEngine:
    return ScriptedEngine(AutoTokenizer.from_pretrained(tokenizer_path), template, replies)


MESSAGES = [
    {"role": "system", "content": "You answer questions about a repository."},
    {"role": "user", "content": "What does add return?"},
]


class Recorder:
    """An output that records what a turn reports."""

    def __init__(self) -> None:
        self.shown, self.calls, self.results = "", [], []

    def info(self, line):
        pass

    def prefill(self, done, total):
        pass

    def text(self, delta):
        self.shown += delta

    def tool_call(self, call):
        self.calls.append(call.label())

    def tool_result(self, call):
        self.results.append(call.output)


# -- parsing ------------------------------------------------------------------------------


def test_tool_format_is_read_from_the_template(tokenizer_path):
    assert tool_format(HERMES) == "hermes"
    assert tool_format(JSON) == "json"
    assert tool_format(None) is None
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    assert tool_format(tok.chat_template) is None  # SmolLM2's template takes no tools


def test_hermes_calls_with_text_before_them():
    text = 'Let me look.\n<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>\n<tool_call>{"name": "grep", "arguments": {"pattern": "x"}}</tool_call>'
    content, calls = parse_tool_calls(text, "hermes")
    assert content == "Let me look."
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("read_file", {"path": "a.py"}, None),
        ("grep", {"pattern": "x"}, None),
    ]


def test_hermes_unterminated_call_string_arguments_and_bad_json():
    _, calls = parse_tool_calls(
        '<tool_call>{"name": "outline", "arguments": "{\\"path\\": \\"a.py\\"}"}', "hermes"
    )
    assert (calls[0].name, calls[0].arguments, calls[0].error) == (
        "outline",
        {"path": "a.py"},
        None,
    )
    _, calls = parse_tool_calls("<tool_call>{name: read_file}</tool_call>", "hermes")
    assert calls[0].error.startswith("the tool call is not valid JSON")
    _, calls = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>', "hermes")
    assert "name" in calls[0].error
    assert parse_tool_calls("no calls here", "hermes") == ("no calls here", [])


def test_json_calls_llama_style():
    content, calls = parse_tool_calls(
        '<|python_tag|>{"name": "grep", "parameters": {"pattern": "def"}}', "json"
    )
    assert content == "" and (calls[0].name, calls[0].arguments) == ("grep", {"pattern": "def"})
    _, calls = parse_tool_calls(
        '{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": 1}}', "json"
    )
    assert [(c.name, c.arguments) for c in calls] == [("a", {}), ("b", {"x": 1})]
    # an answer that is prose, or JSON that is not a call, stays an answer
    assert parse_tool_calls("add returns a + b", "json") == ("add returns a + b", [])
    assert parse_tool_calls('{"a": 1}', "json") == ('{"a": 1}', [])


@pytest.mark.parametrize("fmt,text,shown", [
    ("hermes", 'It is here.<tool_call>{"name": "x"}</tool_call>', "It is here."),
    ("hermes", "a <tool and <tool_cal but no call", "a <tool and <tool_cal but no call"),
    ("json", '  {"name": "x", "parameters": {}}', ""),
    ("json", "<|python_tag|>{}", ""),
    ("json", "plain answer", "plain answer"),
    (None, "<tool_call>shown as is", "<tool_call>shown as is"),
])  # fmt: skip
def test_visible_text_hides_markup_one_character_at_a_time(fmt, text, shown):
    v = VisibleText(fmt)
    out = "".join(v.feed(ch) for ch in text)
    if not v.hidden:  # the held-back tail of a stream that ended without a call
        out += v.text[v.shown :]
    assert out == shown


# -- the loop -----------------------------------------------------------------------------


def test_a_turn_reads_a_file_then_answers(tokenizer_path, repo):
    engine = scripted(tokenizer_path, [
        "I will read it. " + call("read_file", path="calc.py"),
        "add returns a + b (calc.py:2).",
    ])  # fmt: skip
    out = Recorder()
    result = run_turn(engine, MESSAGES, SamplingParams(), out, str(repo))
    assert result.answer == "add returns a + b (calc.py:2)."
    assert result.finish_reason == "stop"
    assert out.shown == "I will read it. add returns a + b (calc.py:2)."  # no markup shown
    assert out.calls == ["read_file(path='calc.py')"]
    assert "return a + b" in out.results[0]
    assert result.usage["steps"] == 2 and result.usage["tool_calls"] == 1
    # the tools were offered, and step 2's prompt holds step 1's call and the real result
    first, second = engine.prompt_text(0), engine.prompt_text(1)
    assert '"name": "read_file"' in first and "<tools>" in first
    assert second.startswith(first)  # the step's prompt extends the last: its KV is reused
    assert '<tool_call>{"name": "read_file", "arguments": {"path": "calc.py"}}' in second
    assert "<tool_response>" in second and "return a + b" in second


def test_tool_errors_go_back_to_the_model(tokenizer_path, repo, tmp_path):
    (tmp_path / "secret.txt").write_text("s3cret")
    engine = scripted(tokenizer_path, [
        call("read_file", path="../secret.txt") + call("nonesuch") + "<tool_call>{oops</tool_call>",
        "I cannot read that.",
    ])  # fmt: skip
    out = Recorder()
    result = run_turn(engine, MESSAGES, SamplingParams(), out, str(repo))
    assert result.answer == "I cannot read that."
    errors = [c.error for c in result.steps[0].calls]
    assert all(errors) and "outside" in errors[0] and "unknown tool" in errors[1]
    second = engine.prompt_text(1)
    assert "s3cret" not in second and second.count("error: ") == 3


def test_the_step_limit_stops_a_model_that_keeps_calling(tokenizer_path, repo):
    engine = scripted(tokenizer_path, [call("list_files")] * 10)
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo), max_steps=2)
    assert len(engine.prompts) == 3  # two tool steps, then one that must answer
    assert result.finish_reason == "step_limit"
    assert len(result.steps) == 2
    assert LIMIT_NOTE in engine.prompt_text(2) and LIMIT_NOTE not in engine.prompt_text(1)


def test_no_tools_without_a_root_or_with_zero_steps(tokenizer_path, repo):
    for root, steps in ((None, 6), (str(repo), 0)):
        engine = scripted(tokenizer_path, [call("list_files")])
        result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), root, max_steps=steps)
        assert len(engine.prompts) == 1 and result.steps == []
        assert "<tools>" not in engine.prompt_text(0)


def test_book_sessions_get_the_book_tools(tokenizer_path, tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("CHAPTER I\n\nIt was a dark night.\n\nCHAPTER II\n\nMorning came.\n")
    engine = scripted(tokenizer_path, [call("search_book", query="night"), "Line 3."])
    out = Recorder()
    result = run_turn(engine, MESSAGES, SamplingParams(), out, str(book), kind="book")
    assert result.answer == "Line 3." and "dark night" in out.results[0]
    assert '"name": "search_book"' in engine.prompt_text(0)
    assert '"name": "read_file"' not in engine.prompt_text(0)


def test_json_format_turn(tokenizer_path, repo):
    engine = scripted(tokenizer_path, [
        '{"name": "outline", "parameters": {"path": "calc.py"}}',
        "calc.py defines add.",
    ], template=JSON)  # fmt: skip
    buf = io.StringIO()
    result = run_turn(engine, MESSAGES, SamplingParams(), JsonOutput(buf), str(repo))
    assert result.answer == "calc.py defines add."
    events = [json.loads(line) for line in buf.getvalue().splitlines()]
    kinds = [e["type"] for e in events]
    assert kinds.index("tool_call") < kinds.index("tool_result")
    call_event = next(e for e in events if e["type"] == "tool_call")
    assert call_event == {"type": "tool_call", "name": "outline", "arguments": {"path": "calc.py"}}
    shown = "".join(e["text"] for e in events if e["type"] == "token")
    assert shown == "calc.py defines add."  # the call's JSON was not streamed as answer


def test_cancel_ends_the_turn_without_running_tools(tokenizer_path, repo):
    engine = scripted(tokenizer_path, ["Let me see. " + call("list_files"), "never"])
    engine.cancel_after = 5
    out = Recorder()
    result = run_turn(engine, MESSAGES, SamplingParams(), out, str(repo))
    assert result.finish_reason == "cancelled" and out.calls == [] and len(engine.prompts) == 1


# -- storing and resuming -----------------------------------------------------------------


def test_tool_steps_are_stored_and_come_back_as_the_same_prompt(tokenizer_path, repo, tmp_path):
    engine = scripted(tokenizer_path, [
        call("read_file", path="README.md"),
        call("grep", pattern="def"),
        "A calculator; add is at calc.py:1.",
        "It adds.",
    ])  # fmt: skip
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    with SessionStore(tmp_path / "s.db") as store:
        session = save_turn(
            store, None, None, str(repo), "repo", None, MESSAGES, None, result, "complete"
        )
        calls = store.tool_calls(session.id)
        assert [(c.name, c.arguments) for c in calls] == [
            ("read_file", {"path": "README.md"}),
            ("grep", {"pattern": "def"}),
        ]
        assert "tiny calculator" in calls[0].result and calls[0].message_id is not None
        history = history_messages(store, session.id)
    # the stored turn renders exactly as the model saw it, plus the answer: a follow-up's
    # prompt extends the last step's prompt
    follow_up = history + [{"role": "user", "content": "And?"}]
    run_turn(engine, follow_up, SamplingParams(), Recorder(), str(repo))
    assert engine.prompt_text(3).startswith(engine.prompt_text(2))
    assert engine.prompt_text(3).count("<tool_response>") == 2


def test_a_tool_call_stored_before_it_ran_renders_as_unfinished(tokenizer_path, tmp_path):
    """A turn interrupted between storing a call and its result: the follow-up's prompt
    renders (a None content once broke the chat template) and says the call did not finish."""
    with SessionStore(tmp_path / "s.db") as store:
        s = store.create(str(tmp_path), "repo", "default")
        store.add_message(s.id, "user", "What is in README.md?")
        m = store.add_message(s.id, "assistant", call("read_file", path="README.md"))
        store.add_tool_call(s.id, "read_file", {"path": "README.md"}, message_id=m.id)
        history = history_messages(store, s.id)
    assert history[-1] == {"role": "tool", "name": "read_file",
                           "content": "error: the call did not finish"}  # fmt: skip
    engine = scripted(tokenizer_path, ["ok"])
    text = engine.tokenizer.decode(engine.chat_tokens(history + [{"role": "user", "content": "?"}]))
    assert "error: the call did not finish" in text


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "read_file", "arguments": {"path": "a", "start": NaN}}',
        '{"name": "read_file", "arguments": {"path": "a", "start": Infinity}}',
        '{"name": "read_file", "arguments": {"start": ' + "9" * 5000 + "}}",
        '{"name": "read_file", "arguments": {"x": ' + "[" * 60 + "]" * 60 + "}}",
        '{"name": "read_file", "arguments": "{\\"start\\": NaN}"}',
    ],
)
def test_tool_calls_json_has_no_nan_huge_numbers_or_deep_nesting(body):
    """What the model writes is stored and exported: a NaN or 60 levels of nesting would
    make the session file one that no import takes; a 5,000-digit number made json raise."""
    _, calls = parse_tool_calls(f"<tool_call>{body}</tool_call>", "hermes")
    assert calls[0].error is not None and calls[0].arguments == {}
