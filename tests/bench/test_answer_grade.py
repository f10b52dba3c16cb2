"""The answer grader on hand-written answers, over the standard library's json package copied
into a real git repository (as the evaluation copies it)."""

from __future__ import annotations

import pytest

from bench.answer_eval_questions import RepoSpec, build_repo
from bench.answer_grade import CLAIM_WINDOW, Expected, RepoIndex, claims_in, grade


@pytest.fixture(scope="module")
def json_repo(tmp_path_factory) -> RepoIndex:
    import sys

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    root = build_repo(RepoSpec("json", "json", "stdlib", version), tmp_path_factory.mktemp("r"))
    return RepoIndex(root)


def lines_of(repo: RepoIndex, path: str, text: str) -> int:
    """The line of path holding text (the stdlib moves between Python versions)."""
    return next(i for i, line in enumerate(repo.lines(path), 1) if text in line)


DETECT = [Expected("json/__init__.py", "detect_encoding")]
RAW = [Expected("json/decoder.py", "JSONDecoder.raw_decode")]


def test_the_copy_is_a_git_repository_of_the_package(json_repo):
    assert "json/decoder.py" in json_repo.files
    assert (json_repo.root / ".git").is_dir()
    assert not any("__pycache__" in f for f in json_repo.files)


@pytest.mark.parametrize(
    "answer",
    [
        "`detect_encoding` in json/__init__.py decides it.",
        "It is detect_encoding (see `__init__.py`).",  # a basename only one file has
        "json.detect_encoding does it: it looks at the first bytes.",  # the module's name
        "The function is defined in `/tmp/x/json/json/__init__.py`: detect_encoding().",
    ],
)
def test_right_file_and_symbol_pass(json_repo, answer):
    g = grade(answer, DETECT, json_repo)
    assert g.correct and g.file_ok and g.symbol_ok


@pytest.mark.parametrize(
    "answer, file_ok, symbol_ok",
    [
        # what the 0.5B answered once: the right name in the wrong file
        ("The function `detect_encoding` in the `json/scanner.py` file.", False, True),
        ("It is `loads` in json/__init__.py.", True, False),
        ("`py_detect_encoding` in json/__init__.py", True, False),  # a longer name is not it
        ("detect_encoding in json/encoding.py", False, True),  # no such file
        ("detect_encoding, in json", False, True),  # a package is not the file
    ],
)
def test_wrong_file_or_symbol_fails(json_repo, answer, file_ok, symbol_ok):
    g = grade(answer, DETECT, json_repo)
    assert not g.correct
    assert (g.file_ok, g.symbol_ok) == (file_ok, symbol_ok)


def test_ambiguous_basename_names_no_file(tmp_path):
    for path in ("a/__init__.py", "b/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("def f():\n    return 1\n")
    repo = RepoIndex(tmp_path)
    assert not grade("f in __init__.py", [Expected("a/__init__.py", "f")], repo).file_ok
    assert grade("f in a/__init__.py", [Expected("a/__init__.py", "f")], repo).correct


def test_alternatives_need_one_pair_named_together(json_repo):
    either = [
        Expected("json/__init__.py", "detect_encoding"),
        Expected("json/decoder.py", "py_scanstring"),
    ]
    assert grade("py_scanstring in json/decoder.py", either, json_repo).correct
    mixed = grade("detect_encoding in json/decoder.py", either, json_repo)
    assert mixed.file_ok and mixed.symbol_ok and not mixed.correct


def test_facts_any_alternative_case_insensitive(json_repo):
    answer = "detect_encoding in json/__init__.py returns 'UTF-8-SIG' for a BOM"
    assert grade(answer, DETECT, json_repo, ("utf-8-sig",)).correct
    assert grade(answer, DETECT, json_repo, ("nope", "utf-8-SIG")).correct
    missed = grade(
        "detect_encoding in json/__init__.py returns utf-8", DETECT, json_repo, ("utf-8-sig",)
    )
    assert not missed.correct and not missed.fact_ok


def test_citations_that_resolve(json_repo):
    d = lines_of(json_repo, "json/__init__.py", "def detect_encoding")
    r = lines_of(json_repo, "json/decoder.py", "def raw_decode")
    answer = (
        f"`detect_encoding` (json/__init__.py:{d}) picks the codec; the check for a BOM is at "
        f"json/__init__.py:{d + 2}, inside detect_encoding.\n"
        f"- **json/decoder.py:{r}-{r + 13}**: `JSONDecoder.raw_decode(s, idx=0)` returns the end.\n"
        f"- decoder.py:L{r} defines raw_decode\n"
        f"- see `json/decoder.py`:{r} for the raw_decode method\n"
    )
    cites = grade(answer, RAW, json_repo).citations
    assert [c.text for c in cites][0] == f"json/__init__.py:{d}"
    assert len(cites) == 5
    assert all(c.resolved for c in cites), [(c.text, c.why) for c in cites]
    # the second is resolved by its enclosing def: line d+2 does not name detect_encoding
    assert "detect_encoding" not in json_repo.lines("json/__init__.py")[d + 1]
    assert (cites[2].start, cites[2].end) == (r, r + 13)


def test_citations_that_do_not_resolve(json_repo):
    d = lines_of(json_repo, "json/__init__.py", "def detect_encoding")
    loads = lines_of(json_repo, "json/__init__.py", "def loads")
    n = len(json_repo.lines("json/decoder.py"))
    answer = (
        f"`loads` is at json/__init__.py:{d}.\n"  # that line is detect_encoding's
        f"`parse_chat_template` at json/parser.py:3.\n"  # an invented file
        f"`JSONDecoder` at json/decoder.py:{n + 1}.\n"  # past the end
        f"`decode` at json/decoder.py:{n - 5}-{n - 10}.\n"  # a backwards range
        f"`scan_once` at json/encoder.py:1-420.\n"  # too broad to say where it is
        f"`detect_encoding` at json/__init__.py:{loads}\n"
    )
    cites = grade(answer, DETECT, json_repo).citations
    assert len(cites) == 6
    assert not any(c.resolved for c in cites), [(c.text, c.why) for c in cites]
    assert cites[1].file is None


def test_a_citation_with_no_identifier_is_checked_for_its_line_only(json_repo):
    ok, past = grade("See json/tool.py:3. And json/tool.py:100000.", DETECT, json_repo).citations
    assert ok.resolved and ok.why == "unchecked" and not ok.claims
    assert not past.resolved


def test_a_line_count_is_no_citation(json_repo):
    # the 0.5B wrote this, copying the packed files' headers
    answer = "Cited files:\njson/tool.py:85 lines\njson/decoder.py:1 line and json/tool.py:3"
    (cite,) = grade(answer, DETECT, json_repo).citations
    assert cite.text == "json/tool.py:3"


def test_each_citation_takes_the_identifiers_beside_it(json_repo):
    d = lines_of(json_repo, "json/__init__.py", "def detect_encoding")
    loads = lines_of(json_repo, "json/__init__.py", "def loads")
    answer = f"`loads` (json/__init__.py:{loads}) calls `detect_encoding` (json/__init__.py:{d})."
    first, second = grade(answer, DETECT, json_repo).citations
    assert first.claims == ["loads"] and second.claims == ["detect_encoding"]
    assert first.resolved and second.resolved
    swapped = f"`loads` (json/__init__.py:{d}) calls `detect_encoding` (json/__init__.py:{loads})."
    assert not any(c.resolved for c in grade(swapped, DETECT, json_repo).citations)

    # the window before a citation starts at a word: "he" of a cut "The" is no claim
    pad = "x" * (CLAIM_WINDOW - len("he file and the class are `"))
    (cite,) = grade(f"{pad}. The file and the class are `json/__init__.py:{d}`", DETECT,
                    json_repo).citations  # fmt: skip
    assert cite.claims == [] and cite.why == "unchecked"


@pytest.mark.parametrize(
    "text, claims",
    [
        ("the `JSONDecoder.raw_decode(s)` method", ["JSONDecoder.raw_decode"]),
        ("calls scanstring() on", ["scanstring"]),
        ("the function loads", ["loads"]),
        ("class JSONDecoder and py_scanstring", ["JSONDecoder", "py_scanstring"]),
        ("the decoder reads it", []),  # plain words claim nothing
        ("`self` and None", []),
        ("The file and function are", []),  # words after "function" that name no code
        ("the method which", []),
    ],
)
def test_claims(text, claims):
    assert claims_in(text) == claims
