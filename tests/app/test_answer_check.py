"""The answer check (agentctx.answer_check): which answers about a real git repository the
files contradict, what the model is then told, and the turn that asks once more (the
scripted model's replies through agentctx.ask.run_turn, stored in a real SQLite store)."""

from __future__ import annotations

import git
import pytest
from transformers import AutoTokenizer

from agentctx.agent import question_of
from agentctx.answer_check import check
from agentctx.ask import TurnLinks, history_messages, run_turn
from agentctx.conversation import Turn
from agentctx.turn_record import save_turn
from engine import SamplingParams
from engine.loading.loader import resolve_source
from sessions.store import SessionStore
from tests.app.scripted import ScriptedEngine
from tests.app.tool_templates import HERMES

DECODER = '''"""A decoder."""

import re


def scan_string(s, end):
    """Scan a string."""
    return s[end:]


class Decoder:
    def __init__(self, hook=None):
        self.hook = hook
        self.parse_members = parse_object

    def decode(self, s):
        return self.parse_members(s)


def parse_object(s, hook):
    """Parse an object's members and apply the hook."""
    return hook(s)
'''


LOADS = '''"""Loading."""


class EmptyDocument(Exception):
    """Raised for an empty document."""


def loads(s):
    """Decode a document.

    More about it.
    """
    if not s:
        raise EmptyDocument("empty")
    if s[0] != "{":
        raise ValueError(s[0])
    return s
'''


@pytest.fixture
def lib(tmp_path):
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "decoder.py").write_text(DECODER)
    (root / "pkg" / "loads.py").write_text(LOADS)
    (root / "README.md").write_text("# lib\n\nA decoder library.\n")
    r = git.Repo.init(root)
    r.index.add(["pkg/decoder.py", "pkg/loads.py", "README.md"])
    r.index.commit("initial")
    return root


ASKS = "Which function parses an object's members and applies the hook?"


@pytest.mark.parametrize(
    "answer",
    [
        "`parse_object` in pkg/decoder.py:20 parses the members and applies the hook.",
        "The `parse_object` function (pkg/decoder.py:20-22) does it.",
        "It is Decoder.decode, at pkg/decoder.py:16.",  # wrong, but the files agree with it
        "parse_object does it.",
    ],
)
def test_an_answer_the_files_agree_with_passes(lib, answer):
    assert check(answer, ASKS, str(lib)) is None


def test_a_citation_past_the_end_of_its_file(lib):
    """The model is shown where the name it gave is defined: such a citation is often the
    right lines of another file."""
    found = check("`parse_object`, at pkg/decoder.py:153-172.", ASKS, str(lib))
    assert found.faults == ["pkg/decoder.py:153-172: pkg/decoder.py has 22 lines"]
    assert found.facts == [
        "`parse_object` is defined at pkg/decoder.py:20-22",
        "`parse_object` (pkg/decoder.py:20-22) says: \"Parse an object's members and apply the "
        'hook."',
    ]


def test_a_citation_of_lines_no_definition_holds(lib):
    found = check("It is at pkg/decoder.py:3.", ASKS, str(lib))
    assert found.faults[0] == "pkg/decoder.py:3: no class or function holds these lines"


def test_lines_outside_definitions_are_a_fault_only_of_code_asked_for(lib):
    """A README's line, or a module's line when the question asks for no definition, is a
    fine citation; a line past the end of any file never is."""
    assert check("See README.md:3, and `parse_object`.", ASKS, str(lib)) is None
    overview = "What does this repository do?"
    assert check("A decoder library (README.md:3; pkg/decoder.py:3).", overview, str(lib)) is None
    found = check("A decoder library (README.md:30).", overview, str(lib))
    assert found.faults == ["README.md:30: README.md has 3 lines"]


def test_a_function_the_repository_only_assigns_shows_where(lib):
    """`parse_members` is an attribute set to parse_object: the model is shown that line,
    which names the function it meant."""
    found = check("The `parse_members` function does it.", ASKS, str(lib))
    assert found.faults == [
        "`parse_members` is no class or function of the repository: pkg/decoder.py:14 "
        "`self.parse_members = parse_object` assigns it `parse_object`, the function or class "
        "it stands for, defined at pkg/decoder.py:20-22"
    ]


def test_a_function_defined_nowhere(lib):
    found = check("The function `parse_json_object` in pkg/decoder.py.", ASKS, str(lib))
    assert found.faults == ["`parse_json_object` is defined nowhere in the repository"]


def test_builtins_and_words_after_class_are_not_claims(lib):
    """ "raises a `ValueError`", "the function `print`", "the class that ..." claim no
    definition of the repository."""
    answer = (
        "The class that does it is `Decoder`, whose `decode` method calls the function "
        "`print`, and `ValueError` is raised (pkg/decoder.py:16)."
    )
    assert check(answer, ASKS, str(lib)) is None


def test_a_name_and_a_citation_that_disagree(lib):
    found = check("The `parse_object` function, at pkg/decoder.py:7.", ASKS, str(lib))
    assert found.faults == [
        "`parse_object` is defined at pkg/decoder.py:20, not where the answer cites it "
        "(pkg/decoder.py:7 is in `scan_string`)"
    ]
    assert found.facts == [
        "pkg/decoder.py:7 is in `scan_string`  pkg/decoder.py:6-8",
        "`parse_object` is defined at pkg/decoder.py:20-22",
        '`scan_string` (pkg/decoder.py:6-8) says: "Scan a string."',
        "`parse_object` (pkg/decoder.py:20-22) says: \"Parse an object's members and apply the "
        'hook."',
    ]


@pytest.mark.parametrize(
    "answer",
    [
        "The function that parses the members is `parse_object`, at pkg/decoder.py:7.",
        "The functions that do it are `parse_object()` (pkg/decoder.py:7-8).",
        "The function that applies the `hook` is `parse_object` (pkg/decoder.py:7).",
    ],
)
def test_the_name_a_sentence_about_a_function_comes_to_is_a_claim(lib, answer):
    found = check(answer, ASKS, str(lib))
    assert found.faults == [
        "`parse_object` is defined at pkg/decoder.py:20, not where the answer cites it "
        f"({found.facts[0].split(' is in ')[0]} is in `scan_string`)"
    ]
    # a sentence that ends in another sentence's name claims nothing: "The function ... .
    # It is `parse_object`" is no claim, and the citation is then the answer's only name
    assert check("The function is here. It is `x` (pkg/decoder.py:7).", ASKS, str(lib)) is None


RAISES = "What does loads raise for an empty document?"


def test_an_exception_that_neither_the_repository_nor_python_has(lib):
    """The model is shown the raise lines of the function it cites."""
    found = check("`loads` (pkg/loads.py:8-17) raises `EmptyDocumentError`.", RAISES, str(lib))
    assert found.faults == ["`EmptyDocumentError` is no exception of the repository or of Python"]
    assert found.facts == [
        "pkg/loads.py:8-17 is in `loads`  pkg/loads.py:8-17",
        '`loads` (pkg/loads.py:8-17) says: "Decode a document."',
        '`loads` raises at pkg/loads.py:14: `raise EmptyDocument("empty")`',
        "`loads` raises at pkg/loads.py:16: `raise ValueError(s[0])`",
    ]
    for right in ("`loads` (pkg/loads.py:8-17) raises `EmptyDocument`.", "It raises ValueError."):
        assert check(right, RAISES, str(lib)) is None


def test_an_answer_that_does_not_say_what_is_asked(lib):
    asks = "What does scan_string return, and where is it defined?"
    found = check("`scan_string` is defined at pkg/decoder.py:6-8.", asks, str(lib))
    assert found.faults == ["the answer does not say what it returns, which the question asks"]
    assert found.facts[-1] == '`scan_string` (pkg/decoder.py:6-8) says: "Scan a string."'
    assert check("`scan_string` (pkg/decoder.py:6-8) returns the rest.", asks, str(lib)) is None
    assert check("It raised nothing.", RAISES, str(lib)) is None


def test_no_definition_named_where_the_question_asks_for_one(lib):
    found = check("It returns 'utf-8-sig', in pkg/decoder.py.", ASKS, str(lib))
    assert found.faults == ["the answer names no class or function that the repository defines"]
    # a question that asks for no definition is answered in words
    assert check("A decoder library.", "What does this repository do?", str(lib)) is None


def test_nothing_to_check_without_a_root_or_an_answer(lib, tmp_path):
    assert check("It is at pkg/decoder.py:99.", ASKS, None) is None
    assert check("   ", ASKS, str(lib)) is None
    assert check("It is at pkg/decoder.py:99.", ASKS, str(tmp_path / "gone")) is None


def test_the_prompt_says_what_the_files_say_and_asks_again(lib):
    found = check("The `parse_object` function, at pkg/decoder.py:7.", ASKS, str(lib))
    prompt = found.prompt(ASKS)
    assert prompt.startswith(
        "An answer to this question was checked against the repository's files:\n"
        "- `parse_object` is"
    )
    assert "- pkg/decoder.py:7 is in `scan_string`" in prompt
    assert prompt.endswith(f"The question: {ASKS}")
    assert found.summary().startswith("checked against the files: `parse_object` is defined")


# -- the turn -------------------------------------------------------------------------------


def test_an_answer_that_the_repository_does_nothing_is_shown_the_readmes_opening(lib):
    """A small model confused by its packed files once answered "What does this repository
    do?" with "The repository does not do anything."; the README says what it is for."""
    (lib / "README.md").write_text("# lib\n\n```sh\nmake\n\nmake test\n```\n\n"
                                   "A decoder library:\nit parses objects.\n\n## More\n")  # fmt: skip
    question = "What does this repository do?"
    found = check("The repository does not do anything.", question, str(lib))
    assert found.faults == ["the README says what the repository is for"]
    opening = "The repository's README begins: A decoder library: it parses objects."
    assert found.facts == [opening]
    assert found.prompt(question) == (
        f"{opening}\nAnswer this question in a sentence or two, from what the README says: "
        "What does this repository do?"
    )
    assert check("It is a decoder library.", question, str(lib)) is None
    (lib / "README.md").unlink()
    assert check("The repository does nothing.", question, str(lib)) is None  # (no README)


@pytest.fixture(scope="module")
def tokenizer(agentctx_home):
    return AutoTokenizer.from_pretrained(resolve_source(None).path)


MESSAGES = [
    {"role": "system", "content": "You answer questions about a repository."},
    {"role": "user", "content": ASKS},
]
CHECKED = TurnLinks(check=True)
WRONG = "The `parse_members` function, at pkg/decoder.py:40."
RIGHT = "`parse_object`, at pkg/decoder.py:20-22."


class Recorder:
    def __init__(self) -> None:
        self.shown, self.lines = "", []

    def info(self, line):
        self.lines.append(line)

    def prefill(self, done, total):
        pass

    def text(self, delta):
        self.shown += delta

    def tool_call(self, call):
        pass

    def tool_result(self, call):
        pass


def test_a_contradicted_answer_is_asked_again_once_and_stored_whole(tokenizer, lib, tmp_path):
    engine = ScriptedEngine(tokenizer, HERMES, [WRONG, RIGHT])
    out = Recorder()
    result = run_turn(engine, MESSAGES, SamplingParams(), out, str(lib), links=CHECKED)
    assert result.answer == RIGHT and result.finish_reason == "stop"
    assert result.usage["answer_check_kept_first"] is False
    assert result.usage["answer_check"] == [
        "pkg/decoder.py:40: pkg/decoder.py has 22 lines",
        "`parse_members` is no class or function of the repository: pkg/decoder.py:14 "
        "`self.parse_members = parse_object` assigns it `parse_object`, the function or class "
        "it stands for, defined at pkg/decoder.py:20-22",
    ]
    assert out.shown == WRONG + RIGHT and out.lines[-1].startswith("checked against the files")
    (step,) = result.steps
    assert step.content == WRONG and step.calls == [] and ASKS in step.after
    second = engine.prompt_text(1)  # the first prompt, then what the files say
    assert second.startswith(engine.prompt_text(0).rsplit("<|im_start|>assistant", 1)[0])
    assert "checked against the repository's files:" in second and WRONG not in second
    assert len(engine.prompts) == 2
    with SessionStore(tmp_path / "s.db") as store:
        turn = Turn(question_of(MESSAGES), str(lib), messages=MESSAGES, result=result)
        turn.status = "complete"
        session = save_turn(store, turn)
        history = history_messages(store, session.id)
    assert [(m["role"], m["content"]) for m in history[-3:]] == [
        ("assistant", WRONG), ("user", step.after), ("assistant", RIGHT)
    ]  # fmt: skip


def test_a_right_answer_is_not_sent_back(tokenizer, lib):
    engine = ScriptedEngine(tokenizer, HERMES, [RIGHT, "never"])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(lib), links=CHECKED)
    assert result.answer == RIGHT and result.steps == [] and "answer_check" not in result.usage
    assert len(engine.prompts) == 1


@pytest.mark.parametrize(
    "second",
    [
        WRONG,  # the same faults again
        ASKS,  # the question written back (the 0.5B did): no definition named
        "",
    ],
)
def test_a_new_answer_no_better_by_the_files_leaves_the_first(tokenizer, lib, second):
    """Asked once more, never twice; the new answer stands only with fewer faults."""
    first = "`parse_object`, at pkg/decoder.py:20-22; see also pkg/decoder.py:99."
    engine = ScriptedEngine(tokenizer, HERMES, [first, second, "never"])
    out = Recorder()
    result = run_turn(engine, MESSAGES, SamplingParams(), out, str(lib), links=CHECKED)
    assert result.answer == first and len(engine.prompts) == 2
    assert result.usage["answer_check_kept_first"] is True
    assert out.lines[-1].startswith("the new answer is no better by the files (")
    assert out.lines[-1].endswith("): the first one stands")
    assert result.token_ids is None  # the ids streamed last are the new answer's


def test_a_new_answer_that_drops_the_name_asked_for_leaves_the_first(tokenizer, lib):
    """The first answer calls a function of the repository by name, at the wrong line; the
    second answers with the facts it was shown (the 0.5B did: "is
    `click._termui_impl.py:240`", then that line's class): fewer faults, but it no longer
    names the function the check did not dispute."""
    first = "The function that does it is `parse_object`, at pkg/decoder.py:7."
    second = "The function that does it is at pkg/decoder.py:7, `scan_string`, lines 6-8."
    engine = ScriptedEngine(tokenizer, HERMES, [first, second, "never"])
    out = Recorder()
    result = run_turn(engine, MESSAGES, SamplingParams(), out, str(lib), links=CHECKED)
    assert result.answer == first and result.usage["answer_check_kept_first"] is True
    assert out.lines[-1] == (
        "the new answer is no better by the files (it no longer names `parse_object`, which "
        "the files do not contradict): the first one stands"
    )
    # nor one that names, instead, the definition that holds the line the first cited
    other = "The function that does it is `scan_string`, at pkg/decoder.py:6-8."
    engine = ScriptedEngine(tokenizer, HERMES, [first, other, "never"])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(lib), links=CHECKED)
    assert result.answer == first and result.usage["answer_check_kept_first"] is True
    # naming it, at the right lines, the second stands
    right = "The function that does it is `parse_object`, at pkg/decoder.py:20-22."
    engine = ScriptedEngine(tokenizer, HERMES, [first, right, "never"])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(lib), links=CHECKED)
    assert result.answer == right and result.usage["answer_check_kept_first"] is False


def test_a_new_answer_cut_by_the_token_limit_is_settled_too(tokenizer, lib):
    """The first answer ended on its own; the new one, cut at the token limit mid-way, is
    no better by the files: the first stands, and the turn ended on its own."""
    first = "`parse_object`, at pkg/decoder.py:20-22; see also pkg/decoder.py:99."
    engine = ScriptedEngine(tokenizer, HERMES, [first, WRONG + " " + WRONG, "never"])
    engine.cuts[1] = 20
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(lib), links=CHECKED)
    assert result.answer == first and result.finish_reason == "stop"
    assert result.usage["answer_check_kept_first"] is True
    # a cut answer with fewer faults stands, cut
    engine = ScriptedEngine(tokenizer, HERMES, [first, RIGHT + " More words follow here.", ""])
    engine.cuts[1] = 20
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(lib), links=CHECKED)
    assert result.answer.startswith(RIGHT) and result.finish_reason == "length"


def test_without_check_the_first_answer_stands(tokenizer, lib):
    engine = ScriptedEngine(tokenizer, HERMES, [WRONG, RIGHT])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(lib))
    assert result.answer == WRONG and len(engine.prompts) == 1
    engine = ScriptedEngine(tokenizer, HERMES, [WRONG, RIGHT])  # a book is not checked
    result = run_turn(
        engine, MESSAGES, SamplingParams(), Recorder(), str(lib), "book", links=CHECKED
    )
    assert result.answer == WRONG


def test_the_revised_answer_may_call_tools(tokenizer, lib):
    call = '<tool_call>{"name": "read_file", "arguments": {"path": "pkg/decoder.py"}}</tool_call>'
    engine = ScriptedEngine(tokenizer, HERMES, [WRONG, call, RIGHT])
    result = run_turn(engine, MESSAGES, SamplingParams(), Recorder(), str(lib), links=CHECKED)
    assert result.answer == RIGHT
    assert [len(s.calls) for s in result.steps] == [0, 1]
    assert "def parse_object" in result.steps[1].calls[0].result
