"""An answer's references (agentctx.references), checked against a real git repository:
the definitions it names, what its citations hold, and `ask` showing them."""

from __future__ import annotations

import json

import git
import pytest

from agentctx.references import for_answer, named, references, render
from tests.app.test_cli_runner import ScriptedBackend, ask, home  # noqa: F401 (a fixture)

DECODER = '''"""A decoder."""


class DecodeError(ValueError):
    pass


class Decoder:
    def decode(self, s):
        return self.raw_decode(s)[0]

    def raw_decode(self, s, idx=0):
        def inner(x):
            return x

        return inner(s), idx


def scanstring(s, end):
    return s[end:]


@overload
def parse(s: str) -> str: ...
@overload
def parse(s: bytes) -> bytes: ...
def parse(s):
    return s
'''
SCANNER = """def make_scanner(ctx):
    def scan_once(s, idx):
        return s, idx

    return scan_once


def decode(b):
    return b
"""


@pytest.fixture
def lib(tmp_path):
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "decoder.py").write_text(DECODER)
    (root / "pkg" / "scanner.py").write_text(SCANNER)
    (root / "pkg" / "extra.py").write_text(
        "def decode(x):\n    return x\n\n\ndef decode2():\n    pass\n"
    )
    (root / "pkg" / "more.py").write_text(
        "def decode(y):\n    return y\n\n\ndef helper():\n    pass\n"
    )
    (root / "pkg" / "other.py").write_text("def helper():\n    pass\n")
    (root / "secrets.yaml").write_text("api_key: def_secret_value\n")
    r = git.Repo.init(root)
    r.index.add(
        [
            "secrets.yaml",
            "pkg/other.py",
            "pkg/decoder.py",
            "pkg/scanner.py",
            "pkg/extra.py",
            "pkg/more.py",
        ]
    )
    r.index.commit("initial")
    return root


def lines(answer: str, root) -> list[str]:
    return [r.line() for r in references(answer, str(root))]


def test_a_named_definition_gets_its_file_and_lines(lib):
    # the model named the right function and the wrong file: the reference says where it is
    got = lines("It is `scanstring`, in pkg/scanner.py.", lib)
    assert got == ["`scanstring`  pkg/decoder.py:19-20"]
    # qualified, nested, CamelCase without backticks, a call
    assert lines("Decoder.raw_decode does it", lib) == [
        "`Decoder.raw_decode`  pkg/decoder.py:12-16"
    ]
    assert lines("the inner function `inner`", lib) == [
        "`Decoder.raw_decode.inner`  pkg/decoder.py:13-14"
    ]
    assert lines("DecodeError is raised", lib) == ["`DecodeError`  pkg/decoder.py:4-5"]
    assert lines("call make_scanner(ctx) first", lib) == ["`make_scanner`  pkg/scanner.py:1-5"]
    # typing overloads: the implementation's lines, once
    assert lines("It is `parse`.", lib) == ["`parse`  pkg/decoder.py:27-28"]


def test_a_name_defined_in_many_places_is_listed_only_where_the_answer_points(lib):
    # decode: Decoder.decode, scanner.decode, extra.decode, more.decode (four places)
    assert lines("It is `decode`.", lib) == []
    assert lines("It is `decode` in pkg/scanner.py.", lib) == ["`decode`  pkg/scanner.py:8-9"]
    assert lines("It is `Decoder.decode`.", lib) == ["`Decoder.decode`  pkg/decoder.py:9-10"]
    assert lines("`__init__` and `self`", lib) == []  # names that name nothing in particular


def test_each_citation_form_says_what_its_lines_hold(lib):
    assert lines("See pkg/decoder.py:12.", lib) == [
        "pkg/decoder.py:12 is in `Decoder.raw_decode`  pkg/decoder.py:12-16"
    ]
    assert lines("pkg/decoder.py:13-14", lib) == [
        "pkg/decoder.py:13-14 is in `Decoder.raw_decode.inner`  pkg/decoder.py:13-14"
    ]
    # a path and then "line(s) N" in words, and a tail of a path
    assert lines("defined in the `pkg/decoder.py` file, lines 4-5.", lib) == [
        "pkg/decoder.py:4-5 is in `DecodeError`  pkg/decoder.py:4-5"
    ]
    assert lines("in the `pkg.scanner.py` file at line 2", lib) == [
        "pkg.scanner.py:2 is in `make_scanner.scan_once`  pkg/scanner.py:2-3"
    ]  # a module's dotted name with the file's suffix
    assert lines("in `scanner.py` at line 2", lib) == [
        "scanner.py:2 is in `make_scanner.scan_once`  pkg/scanner.py:2-3"
    ]
    # a blank line just above a definition points at it
    assert lines("pkg/decoder.py:18", lib) == [
        "pkg/decoder.py:18 is in `scanstring`  pkg/decoder.py:19-20"
    ]


def test_a_citation_that_resolves_to_nothing_says_why(lib):
    assert lines("pkg/decoder.py:99", lib) == ["pkg/decoder.py:99: pkg/decoder.py has 28 lines"]
    assert lines("pkg/nope.py:3", lib) == [
        "pkg/nope.py:3: no single file of the repository is pkg/nope.py"
    ]
    assert lines("pkg/decoder.py:1", lib) == [
        "pkg/decoder.py:1: no class or function holds these lines"
    ]
    # a secret is no file of the repository: it is never read
    got = lines("the key is in secrets.yaml:1", lib)
    assert got == ["secrets.yaml:1: no single file of the repository is secrets.yaml"]
    assert "def_secret_value" not in render(references("see `def_secret_value`", str(lib)))


def test_named_citation_and_list_are_each_given_once_and_capped(lib):
    answer = "`scanstring` (pkg/decoder.py:19) and `scanstring` again, pkg/decoder.py:19"
    assert lines(answer, lib) == ["pkg/decoder.py:19 is in `scanstring`  pkg/decoder.py:19-20"]
    # a name defined in several files, cited at one of them: its other definitions are not
    # listed beside the one the citation means (a qualified name still is)
    assert lines("`helper`", lib) == ["`helper`  pkg/more.py:5-6", "`helper`  pkg/other.py:1-2"]
    assert lines("`helper` at pkg/other.py:1", lib) == [
        "pkg/other.py:1 is in `helper`  pkg/other.py:1-2"
    ]
    assert lines("`parse` at pkg/scanner.py:8, and `Decoder.decode`", lib) == [
        "pkg/scanner.py:8 is in `decode`  pkg/scanner.py:8-9",
        "`parse`  pkg/decoder.py:27-28",
        "`Decoder.decode`  pkg/decoder.py:9-10",
    ]
    assert lines("`decode` at pkg/scanner.py:8", lib) == [
        "pkg/scanner.py:8 is in `decode`  pkg/scanner.py:8-9"
    ]
    many = " ".join(f"pkg/decoder.py:{n}" for n in range(2, 20))
    assert len(references(many, str(lib))) == 8


def test_names_an_answer_writes():
    got = named("The `JSONDecoder.raw_decode(s)` method calls py_scanstring; see `def foo` "
                "and the class Bar and `pkg/a.py`.")  # fmt: skip
    assert got == ["JSONDecoder.raw_decode", "foo", "Bar", "py_scanstring"]


def test_for_answer_is_none_for_a_book_an_empty_answer_or_a_root_gone(lib, tmp_path):
    assert for_answer("`scanstring`", str(lib)) != []
    assert for_answer("`scanstring`", str(lib), "book") == []
    assert for_answer("  ", str(lib)) == []
    assert for_answer("`scanstring`", str(tmp_path / "gone")) == []


def test_ask_shows_the_references_after_the_answer(lib, home):  # noqa: F811
    backend = ScriptedBackend([("It is `scanstring` in pkg/scanner.py.", "stop")])
    result = ask(backend, "Which function scans?", "--repo", str(lib), "--model", "m")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "It is `scanstring` in pkg/scanner.py.\n\n"
        "References (checked against the files):\n- `scanstring`  pkg/decoder.py:19-20\n"
    )
    backend = ScriptedBackend([("It is `scanstring`.", "stop")])
    result = ask(backend, "Which?", "--repo", str(lib), "--model", "m", "--no-references")
    assert result.stdout == "It is `scanstring`.\n"
    backend = ScriptedBackend([("It is `scanstring`.", "stop")])
    result = ask(backend, "Which?", "--repo", str(lib), "--model", "m", "--json")
    events = [json.loads(line) for line in result.stdout.splitlines()]
    (refs,) = [e for e in events if e["type"] == "references"]
    assert refs["references"] == [{
        "cited": None, "why": None,
        "definition": {"name": "scanstring", "path": "pkg/decoder.py", "start": 19, "end": 20},
    }]  # fmt: skip
    assert events[-1]["type"] == "usage" and events[-1]["references"] == refs["references"]


@pytest.mark.anyio
async def test_the_tui_logs_the_references_after_the_answer(repo, store, agentctx_home):
    from transformers import AutoTokenizer

    from agentctx.tui.app import AgentApp
    from engine.loading.loader import resolve_source
    from tests.app.pilot_support import finish, submit
    from tests.app.scripted import ScriptedEngine
    from tests.app.test_tui_compact import log_lines
    from tests.app.tool_templates import HERMES

    tokenizer = AutoTokenizer.from_pretrained(resolve_source(None).path)
    engine = ScriptedEngine(tokenizer, HERMES, ["It is `add`, at calc.py:2."], 8192)
    app = AgentApp(repo=str(repo), engine_factory=lambda model: engine, store=store)
    async with app.run_test(size=(100, 30)) as pilot:
        await submit(pilot, "What does add return?")
        await finish(pilot)
        lines = log_lines(app)
        refs = "References (checked against the files):\n- calc.py:2 is in `add`  calc.py:1-2"
        assert refs in lines and "tokens in context" in lines[-1]
        assert lines.index(refs) == len(lines) - 2  # after the answer, before its summary
