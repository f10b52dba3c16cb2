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
    question_of,
    tool_format,
)
from agentctx.ask import TOOL_PROMPTS, history_messages, run_turn
from agentctx.conversation import Turn
from agentctx.output import JsonOutput, TextOutput
from agentctx.turn_record import save_turn
from engine import SamplingParams
from engine.loading.loader import resolve_source
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


OFFERED = ("list_files", "read_file", "grep", "outline")
GREP = ("grep", {"pattern": "def add"})


@pytest.mark.parametrize("text,content,calls", [
    # tagged: closed, unclosed, closing tag missing before the next, JSON fenced inside
    ('<tool_call>\n{"name": "grep", "arguments": {"pattern": "def add"}}\n</tool_call>', "", [GREP]),
    ('<tool_call>{"name": "grep", "arguments": {"pattern": "def add"}}', "", [GREP]),
    ('<tool_call>{"name": "grep", "arguments": {"pattern": "def add"}}\n<tool_call>'
     '{"name": "outline", "arguments": {"path": "calc.py"}}</tool_call>',
     "", [GREP, ("outline", {"path": "calc.py"})]),
    ('<tool_call>\n```json\n{"name": "grep", "arguments": {"pattern": "def add"}}\n```\n</tool_call>',
     "", [GREP]),
    # fenced, as the 0.5B writes them, and with prose before
    ('```json\n{\n  "name": "grep",\n  "arguments": {\n    "pattern": "def add"\n  }\n}\n```', "", [GREP]),
    ('I will search.\n```tool_call\n{"name": "grep", "arguments": {"pattern": "def add"}}\n```',
     "I will search.", [GREP]),
    ('```\n[{"name": "grep", "arguments": {"pattern": "def add"}}, {"name": "list_files"}]\n```',
     "", [GREP, ("list_files", {})]),
    # bare: the whole message, several, after prose, a list, cut off before its last brace
    ('{"name": "grep", "arguments": {"pattern": "def add"}}', "", [GREP]),
    ('{"name": "grep", "parameters": {"pattern": "def add"}};\n{"name": "read_file", '
     '"arguments": "{\\"path\\": \\"calc.py\\"}"}', "", [GREP, ("read_file", {"path": "calc.py"})]),
    ('Let me look.\n{"name": "grep", "arguments": {"pattern": "def add"}}\nIt returns 3.',
     "Let me look.", [GREP]),
    ('{"name": "grep", "arguments": {"pattern": "def add"}', "", [GREP]),
    # repaired: trailing commas, single quotes, Python's True, the OpenAI wrapper, flat
    ('{"name": "grep", "arguments": {"pattern": "def add",},}', "", [GREP]),
    ("{'name': 'grep', 'arguments': {'pattern': 'def add', 'ignore_case': True}}", "",
     [("grep", {"pattern": "def add", "ignore_case": True})]),
    ('{"type": "function", "function": {"name": "grep", "arguments": {"pattern": "def add"}}}',
     "", [GREP]),
    ('{"name": "read_file", "path": "calc.py"}', "", [("read_file", {"path": "calc.py"})]),
    # a name that is no tool: a call (its error says which tools exist) when tagged or
    # when it is the whole message; answer text when it sits in prose
    ('```json\n{"name": "add", "arguments": {"a": 1}}\n```', "", [("add", {"a": 1})]),
    ('For example:\n```json\n{"name": "add", "arguments": {"a": 1}}\n```\nis a call.',
     'For example:\n```json\n{"name": "add", "arguments": {"a": 1}}\n```\nis a call.', []),
    # answers that hold JSON or code stay answers
    ('```json\n{"a": 1, "b": [2]}\n```', '```json\n{"a": 1, "b": [2]}\n```', []),
    ('{"name": "calc", "version": "1.0"}', '{"name": "calc", "version": "1.0"}', []),
    ('```python\ndef f():\n    return {"name": "grep", "arguments": {}}\n```',
     '```python\ndef f():\n    return {"name": "grep", "arguments": {}}\n```', []),
    ("See [the docs] and Bob's note.\n[x] done", "See [the docs] and Bob's note.\n[x] done", []),
])  # fmt: skip
def test_the_forms_real_models_write(text, content, calls):
    got_content, got = parse_tool_calls(text, "hermes", OFFERED)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got] == calls
    assert all(c.error is None for c in got)
    # streamed a character at a time, the screen shows the content and no call markup
    v = VisibleText("hermes", OFFERED)
    shown = "".join(v.feed(ch) for ch in text)
    assert (shown + v.end(got_content)).rstrip() == got_content


def test_an_ordinary_code_block_streams_as_it_comes():
    v = VisibleText("hermes", OFFERED)
    text = "Like this:\n```python\nx = {'a': 1}\nprint(x)\n"
    shown = "".join(v.feed(ch) for ch in text)
    assert shown == text  # nothing held back: no call starts a python block
    v = VisibleText("hermes", OFFERED)
    shown = "".join(v.feed(ch) for ch in '```json\n{"name": "gr')
    assert shown == ""  # maybe a call: held until it closes


def test_calls_that_do_not_parse_are_reported():
    _, calls = parse_tool_calls('<tool_call>{"name": "grep", "arguments": {"p": "x', "hermes")
    assert calls[0].problem == "unparsed" and "not valid JSON" in calls[0].error
    _, calls = parse_tool_calls('<tool_call>{"name": "grep", "arguments": 3}</tool_call>', "hermes")
    assert calls[0].problem == "unparsed" and "must be a JSON object" in calls[0].error
    _, calls = parse_tool_calls("<tool_call>no json at all</tool_call>", "hermes")
    assert calls[0].problem == "unparsed"
    assert parse_tool_calls("<tool_call>x", None) == ("<tool_call>x", [])  # no tools: text


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


def test_fenced_and_malformed_calls_run_or_get_errors_that_say_what_exists(tokenizer_path, repo):
    """As the real 0.5B writes them: a fenced call of a tool that does not exist (nor does
    a function of that name), then arguments the schema refuses, then a fenced call that
    runs."""
    fenced = '```json\n{{"name": "{}", "arguments": {}}}\n```'.format
    engine = scripted(tokenizer_path, [
        fenced("multiply", '{"a": 1, "b": 2}'),
        fenced("grep", '{"pattern": "def add", "path": "calc.py"}'),
        fenced("grep", '{"pattern": "def add"}'),
        "add returns a + b (calc.py:2).",
    ])  # fmt: skip
    out, buf = Recorder(), io.StringIO()
    result = run_turn(engine, MESSAGES, SamplingParams(), out, str(repo))
    assert result.answer == "add returns a + b (calc.py:2)."
    assert out.shown == result.answer  # no call's JSON reached the screen
    unknown, bad, good = (s.calls[0] for s in result.steps)
    assert unknown.problem == "unknown_tool" and "the only tools are" in unknown.error
    assert "read_file(path: string" in unknown.error and "git_blame(" in unknown.error
    # a way out: how to find the name, as a call to copy
    assert (
        'If multiply is a name in the text, find it with <tool_call>{"name": "grep", '
        '"arguments": {"pattern": "multiply"}}</tool_call>' in unknown.error
    )
    assert bad.problem == "bad_arguments" and "unknown argument 'path'" in bad.error
    assert "grep(pattern: string, path_glob?: string" in bad.error
    assert good.error is None and "calc.py:1: def add" in good.result
    assert "chapters" not in unknown.error  # only the tools this session was offered
    # the model saw each error, and its calls rendered back in the template's own format
    assert engine.prompt_text(1).count("the only tools are") == 1
    assert '<tool_call>{"name": "multiply", "arguments": {"a": 1, "b": 2}}' in engine.prompt_text(1)
    assert {k: v for k, v in result.usage.items() if k.startswith("tool_calls")} == {
        "tool_calls": 3,
        "tool_calls_parsed": 3,
        "tool_calls_succeeded": 1,
        "tool_calls_malformed": 2,
    }
    # the same counts in the --json usage event and on the stderr summary line
    engine = scripted(
        tokenizer_path, [fenced("grep", '{"pattern": "def add"}'), "<tool_call>{oops", "ok"]
    )
    output = JsonOutput(buf)
    output.end(run_turn(engine, MESSAGES, SamplingParams(), output, str(repo)).usage)
    usage = json.loads(buf.getvalue().splitlines()[-1])
    assert usage["type"] == "usage" and usage["tool_calls"] == 2
    assert (usage["tool_calls_parsed"], usage["tool_calls_succeeded"]) == (1, 1)
    assert usage["tool_calls_malformed"] == 1
    err = io.StringIO()
    TextOutput(io.StringIO(), err).end({**usage, "cached_tokens": 0, "ttft_s": 0.1,
                                        "prefill_tok_s": 1.0, "decode_tok_s": 1.0})  # fmt: skip
    assert "tool calls: 2 made, 1 parsed, 1 succeeded, 1 malformed" in err.getvalue()


def test_a_function_called_as_a_tool_after_its_file_was_read(tokenizer_path, repo, tmp_path):
    """The 0.5B reads the function, then calls it to run it: it is told to answer."""
    engine = scripted(tokenizer_path, [
        call("read_file", path="calc.py"), call("add", a=1, b=2), "add returns a + b.",
    ])  # fmt: skip
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    error = result.steps[1].calls[0].error
    assert "defined in the repository (calc.py:1), not a tool: it cannot be run" in error
    assert "You have read its code: answer from it now" in error and 'read_file"' not in error
    # a step that only loops is followed by a user message that asks for the answer, and
    # the next step is the answer whatever it holds
    asked = "Answer the question from the tool results above, in words, without calling a tool."
    assert result.steps[0].after is None and result.steps[1].after.startswith(asked)
    assert result.steps[1].after.endswith("The question: What does add return?")
    assert engine.prompt_text(2).count(asked) == 1 and engine.prompt_text(1).count(asked) == 0
    assert result.answer == "add returns a + b." and result.finish_reason == "stop"
    # stored in place, so a follow-up's prompt extends the answer step's
    with SessionStore(tmp_path / "s.db") as store:
        turn = Turn(question_of(MESSAGES), str(repo), messages=MESSAGES, result=result)
        turn.status = "complete"
        session = save_turn(store, turn)
        history = history_messages(store, session.id)
    follow_up = scripted(tokenizer_path, ["It adds."])
    run_turn(follow_up, history + [{"role": "user", "content": "And?"}], SamplingParams(),
             Recorder(), str(repo))  # fmt: skip
    assert follow_up.prompt_text(0).startswith(engine.prompt_text(2))


def test_a_step_that_calls_on_after_a_looping_one_is_stopped(tokenizer_path, repo):
    engine = scripted(tokenizer_path, [
        call("list_files"), call("list_files"), call("grep", pattern="x"), call("grep", pattern="y"),
    ])  # fmt: skip
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    # the step that had to answer called again: its call is refused and the question asked
    # once more; a model that still calls is stopped
    assert len(engine.prompts) == 4 and result.finish_reason == "step_limit"
    assert result.steps[2].calls[0].error.startswith("not run: no more tool calls")
    assert result.usage["tool_calls"] == 4 and result.usage["tool_calls_succeeded"] == 1


def test_a_step_that_must_answer_but_calls_is_asked_once_more(tokenizer_path, repo):
    """The 0.5B, told to answer, wrote a call and no text (an empty answer): the call is
    refused with NOT_RUN, the question is asked again, and the model answers."""
    engine = scripted(tokenizer_path, [
        call("list_files"), call("list_files"), call("grep", pattern="def add"),
        "add returns a + b.",
    ])  # fmt: skip
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    assert result.answer == "add returns a + b." and result.finish_reason == "stop"
    refused = result.steps[2].calls[0]
    assert refused.result is None and refused.error.startswith("not run: no more tool calls")
    asked = "Answer the question from the tool results above, in words, without calling a tool."
    assert engine.prompt_text(3).count(asked) == 2 and "not run: no more" in engine.prompt_text(3)
    assert result.usage["tool_calls"] == 3 and result.usage["tool_calls_succeeded"] == 1


def test_an_empty_answer_after_tool_results_is_asked_for_once_more(tokenizer_path, repo):
    """The 1.5B read a file and then ended its turn with no text: the question is asked
    again in words, once; a second empty answer is the turn's answer."""
    engine = scripted(tokenizer_path, [call("read_file", path="calc.py"), "", "add returns a + b."])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    assert result.answer == "add returns a + b." and result.finish_reason == "stop"
    asked = "Answer the question from the tool results above, in words, without calling a tool."
    assert engine.prompt_text(2).count(asked) == 1 and engine.prompt_text(1).count(asked) == 0
    assert len(result.steps) == 1  # the empty reply is no step of its own
    engine = scripted(tokenizer_path, [call("read_file", path="calc.py"), "", "", "late"])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    assert result.answer == "" and len(engine.prompts) == 3
    engine = scripted(tokenizer_path, [""])  # no tool results: nothing to answer from
    assert run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo)).answer == ""
    assert len(engine.prompts) == 1


def test_a_citation_as_a_path_and_a_repeated_call(tokenizer_path, repo):
    """read_file takes a path:line a model copied from grep; a call made again does not run
    again: the model is told to use the result it has."""
    engine = scripted(tokenizer_path, [
        call("read_file", path="calc.py:2: return a + b"),
        call("read_file", path="calc.py:2: return a + b") + call("read_file", path="calc.py:9"),
        "add returns a + b.",
    ])  # fmt: skip
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    first, (again, past_end) = result.steps[0].calls[0], result.steps[1].calls
    assert first.result.startswith("calc.py (lines 2-2 of 2)") and "return a + b" in first.result
    assert again.result is None and "made before in this turn" in again.error
    assert past_end.error.startswith("cannot read calc.py:9")  # the name's own error
    assert result.usage["tool_calls_succeeded"] == 1 and result.usage["tool_calls_malformed"] == 0


def test_a_failed_call_made_again_is_not_run_and_the_next_step_answers(tokenizer_path, repo):
    """The 0.5B repeats a call that failed (read_chapter past the last chapter, here a file
    that is not there): the repeat is not run, it is told why, and the turn answers."""
    missing = call("read_file", path="nope.py")
    engine = scripted(tokenizer_path, [missing, missing, "There is no nope.py."])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    first, again = result.steps[0].calls[0], result.steps[1].calls[0]
    assert first.error.startswith("cannot read nope.py") and again.result is None
    assert again.error.startswith("this call was made before in this turn and failed (cannot")
    assert result.steps[1].after.startswith("Answer the question from the tool results above")
    assert result.answer == "There is no nope.py." and len(engine.prompts) == 3


def test_a_tool_that_is_no_name_of_the_repository_gets_a_grep_to_copy(tokenizer_path, repo):
    engine = scripted(tokenizer_path, ['{"name": "subtract", "arguments": {}}', "No such."])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    error = result.steps[0].calls[0].error
    assert '<tool_call>{"name": "grep", "arguments": {"pattern": "subtract"}}' in error
    engine = scripted(tokenizer_path, ['{"name": "subtract", "parameters": {}}', "No."], JSON)
    error = (
        run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo)).steps[0].calls[0].error
    )
    assert '{"name": "grep", "parameters": {"pattern": "subtract"}}' in error  # Llama's form


def test_a_turn_without_calls_counts_zero_and_the_tool_prompt_is_added(tokenizer_path, repo):
    engine = scripted(tokenizer_path, ["add returns a + b."])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    assert result.usage["tool_calls"] == 0 and result.usage["tool_calls_malformed"] == 0
    assert TOOL_PROMPTS["repo"] in engine.prompt_text(0)
    engine = scripted(tokenizer_path, ["add returns a + b."])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), None)  # no tools
    assert "tool_calls" not in result.usage and TOOL_PROMPTS["repo"] not in engine.prompt_text(0)


def test_the_step_limit_stops_a_model_that_keeps_calling(tokenizer_path, repo):
    engine = scripted(tokenizer_path, [call("list_files")] * 10)
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo), max_steps=2)
    # two tool steps, one that must answer (its call refused), the question once more
    assert len(engine.prompts) == 4
    assert result.finish_reason == "step_limit"
    assert len(result.steps) == 3
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
        turn = Turn(question_of(MESSAGES), str(repo), messages=MESSAGES, result=result)
        turn.status = "complete"
        session = save_turn(store, turn)
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
        '{"name": "read_file", "arguments": {"path": "a", "start": 1e999}}',
        "{'name': 'read_file', 'arguments': {'path': 'a', 'start': NaN,}}",
    ],
)
def test_tool_calls_json_has_no_nan_huge_numbers_or_deep_nesting(body):
    """What the model writes is stored and exported: a NaN or 60 levels of nesting would
    make the session file one that no import takes; a 5,000-digit number made json raise."""
    _, calls = parse_tool_calls(f"<tool_call>{body}</tool_call>", "hermes")
    assert calls[0].error is not None and calls[0].arguments == {}


def test_a_turn_without_answer_text_says_so_on_stderr():
    usage = {"prompt_tokens": 9, "cached_tokens": 0, "completion_tokens": 1, "ttft_s": 0.1,
             "prefill_tok_s": 1.0, "decode_tok_s": 1.0, "tool_calls": 2}  # fmt: skip
    for written, said in (("", True), ("\n  \n", True), ("Swift.", False)):
        out, err = io.StringIO(), io.StringIO()
        text = TextOutput(out, err)
        text.text(written)
        text.end(usage)
        line = "no answer: the model stopped without writing one (after 2 tool calls)"
        assert (line in err.getvalue()) == said, (written, err.getvalue())


def test_a_symbol_written_as_the_tool_name_runs_as_the_tool_its_arguments_fit(tokenizer_path, repo):
    """The 0.5B and 1.5B write the symbol they want as the name, with read_file's or grep's
    arguments: the call runs as that tool, is counted as repaired, and the label says so."""
    engine = scripted(tokenizer_path, [
        call("add", path="calc.py", start=1, end=2) + call("subtract", pattern="def add"),
        "add returns a + b.",
    ])  # fmt: skip
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    read, found = result.steps[0].calls
    assert (read.name, read.repaired_from, read.error) == ("read_file", "add", None)
    assert "return a + b" in read.result and read.label().endswith("(written as add)")
    assert (found.name, found.repaired_from) == ("grep", "subtract") and "calc.py:1" in found.result
    assert result.usage["tool_calls_succeeded"] == 2 and result.usage["tool_calls_repaired"] == 2
    assert result.usage["tool_calls_malformed"] == 0
    err = io.StringIO()
    TextOutput(io.StringIO(), err).end({**result.usage, "cached_tokens": 0, "ttft_s": 0.1,
                                        "prefill_tok_s": 1.0, "decode_tok_s": 1.0})  # fmt: skip
    assert "0 malformed, 2 run as the tool their arguments fit" in err.getvalue()


def test_a_function_of_the_repository_called_as_a_tool_reads_its_definition(tokenizer_path, repo):
    """The 1.5B calls the function it wants to show ("add" with add's own arguments, or
    "Calc.add" with a made-up path): its definition is read instead, counted as repaired;
    once its file was read, a second such call is told to answer instead."""
    engine = scripted(tokenizer_path, [
        call("add", a=1, b=2), call("Calc.add", file="calc.py:9", line=9), "add returns a + b.",
    ])  # fmt: skip
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
    read = result.steps[0].calls[0]
    assert (read.name, read.repaired_from, read.error) == ("read_file", "add", None)
    assert read.arguments == {"path": "calc.py", "start": 1, "max_lines": 40}
    assert "return a + b" in read.result and read.label().endswith("(written as add)")
    again = result.steps[1].calls[0]
    assert again.name == "Calc.add" and "You have read its code" in again.error
    assert result.usage["tool_calls_repaired"] == 1 and result.answer == "add returns a + b."


def test_the_usage_record_says_how_the_turn_ended(tokenizer_path, repo):
    """finish_reason goes into the usage (stored as the answer's timings, and --json's
    usage event): stop, step_limit, and interrupted for a cancelled stream."""
    ends = []
    for replies, cancel_after in (
        (["It adds."], None),
        ([call("list_files")] * 4, None),
        (["Let me see, it adds.", "never"], 5),
    ):
        engine = scripted(tokenizer_path, replies)
        engine.cancel_after = cancel_after
        result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(repo))
        ends.append(result.usage["finish_reason"])
    assert ends == ["stop", "step_limit", "interrupted"]
