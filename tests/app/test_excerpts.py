"""The definitions a question is about, shown again right before it (agentctx.excerpts),
on real git repositories in tmp dirs."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from agentctx.code_outline import inner_functions, outline_symbols
from agentctx.excerpts import HEADER, MAX_EXCERPT_LINES, chunks
from agentctx.packing import pack_repository, summary_line
from agentctx.packing_report import manifest_data, report_lines, stored_manifest
from tests.tools.support import write

AUTHOR = git.Actor("Test", "test@example.com")

CODECS = '''"""Text codecs."""
import codecs


def guess_encoding(data):
    """Tell UTF-8 from UTF-16 and UTF-32 by the byte order mark."""
    if data.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    return "utf-8"


def widen(text):
    return text.upper()


class Reader:
    """Reads records from a stream."""

    size = 4

    # the one entry point
    @staticmethod
    def read_record(stream):
        """Read one length-prefixed record and return its payload."""
        length = int(stream.read(4))
        return stream.read(length)

    def close(self):
        pass
'''

LONG = "def long_one():\n" + "".join(f"    step_{i} = {i}\n" for i in range(100))

FILES = {
    "README.md": "# textkit\n\nSmall text helpers.\n",
    "textkit/__init__.py": "",
    "textkit/codecs_util.py": CODECS,
    "textkit/other.py": "def unrelated():\n    return 1\n\n\n" + LONG,
}


def count_words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "textkit"
    root.mkdir()
    for rel_path, content in FILES.items():
        write(root, rel_path, content)
    with git.Repo.init(root) as r:
        r.index.add(list(FILES))
        r.index.commit("initial", author=AUTHOR, committer=AUTHOR)
    return root


def section(text: str) -> str:
    assert HEADER in text
    return text[text.index(HEADER) :]


def test_the_definition_a_question_describes_is_shown_last_with_its_lines(repo: Path) -> None:
    packed = pack_repository(
        repo, "Which function tells UTF-16 from UTF-32 by the byte order mark?", count_words,
        5_000,
    )  # fmt: skip
    first = packed.excerpts[0]
    assert (first.path, first.name) == ("textkit/codecs_util.py", "guess_encoding")
    lines = CODECS.split("\n")
    assert lines[first.start - 1] == "def guess_encoding(data):"
    shown = section(packed.text)
    # the section ends the packed text: nothing comes between it and the question
    assert packed.text.endswith(shown)
    for number in range(first.start, first.end + 1):
        line = lines[number - 1]
        assert (f"{number}| {line}" if line else f"{number}|") in shown
    assert "widen" not in shown  # matches nothing the question says


def test_a_method_is_named_with_its_class_and_keeps_its_decorator_and_comment(repo: Path) -> None:
    packed = pack_repository(
        repo, "What reads one length-prefixed record and returns its payload?", count_words,
        5_000,
    )  # fmt: skip
    first = packed.excerpts[0]
    assert first.name == "Reader.read_record"
    lines = CODECS.split("\n")
    assert lines[first.start - 1].strip() == "# the one entry point"
    assert lines[first.start].strip() == "@staticmethod"
    # the chunk stops before the next method
    assert "def close" not in "\n".join(lines[first.start - 1 : first.end])


def test_an_overview_question_gets_no_excerpts(repo: Path) -> None:
    packed = pack_repository(repo, "What does this repository do?", count_words, 5_000)
    assert packed.excerpts == []
    assert HEADER not in packed.text


def test_a_small_budget_gets_no_excerpts(repo: Path) -> None:
    packed = pack_repository(repo, "Which function reads a record?", count_words, 600)
    assert packed.excerpts == []
    assert packed.tokens <= 600


def test_excerpts_stay_within_their_share_and_line_cap(repo: Path) -> None:
    budget = 5_000
    packed = pack_repository(repo, "Where are step_5 and step_99 set?", count_words, budget)
    long = next(e for e in packed.excerpts if e.name == "long_one")
    assert long.end - long.start + 1 == MAX_EXCERPT_LINES
    assert f"... ({101 - MAX_EXCERPT_LINES} more lines of long_one)" in packed.text
    assert sum(e.tokens for e in packed.excerpts) <= budget * 0.15
    assert packed.tokens <= budget


def test_the_report_and_manifest_list_the_excerpts(repo: Path) -> None:
    packed = pack_repository(repo, "Which function tells UTF-8 from UTF-16?", count_words, 5_000)
    assert "definition" in summary_line(packed) and "again" in summary_line(packed)
    data = manifest_data(packed)
    assert [e["symbol"] for e in data["excerpts"]] == [e.name for e in packed.excerpts]
    assert all(f["packed"] in ("full", "truncated") for f in data["files"])
    lines = report_lines(*stored_manifest(packed), packed.tokens)
    assert any(line.startswith("definitions shown again before the question") for line in lines)
    assert any("guess_encoding, lines" in line for line in lines)


def test_chunks_cover_each_definition_up_to_the_next() -> None:
    lines = CODECS.split("\n")
    found = chunks("c.py", lines, outline_symbols("c.py", CODECS))
    names = [c.name for c in found]
    assert names == ["guess_encoding", "widen", "Reader", "Reader.read_record", "Reader.close"]
    reader = found[2]
    # a class's chunk is its head: it ends before its first member's comment
    assert lines[reader.end - 1].strip() == "" and "size = 4" in lines[reader.end - 2]
    assert found[-1].end == len(lines)


def test_each_excerpt_is_headed_by_its_name_beside_its_place(repo: Path) -> None:
    packed = pack_repository(repo, "Which function tells UTF-8 from UTF-16?", count_words, 5_000)
    first = packed.excerpts[0]
    header = f"--- guess_encoding, textkit/codecs_util.py:{first.start}-{first.end} ---"
    assert header in section(packed.text)


NESTED = '''class Encoder:
    def encode(self, o):
        """Encode o as text."""
        markers = {}

        def floatstr(value, allow_nan=True):
            if value != value:
                return "NaN"
            return repr(value)

        return floatstr(o)


def decorate(f):
    def wrapper(*args):
        def deeper():
            return f(*args)

        return deeper()

    return wrapper
'''


def test_an_inner_function_is_a_chunk_of_its_own_named_within_its_function() -> None:
    lines = NESTED.split("\n")
    symbols = outline_symbols("n.py", NESTED) + inner_functions("n.py", NESTED)
    found = {c.name: c for c in chunks("n.py", lines, symbols)}
    assert list(found) == ["Encoder", "Encoder.encode", "Encoder.encode.floatstr", "decorate",
                           "decorate.wrapper", "decorate.deeper"]  # fmt: skip
    inner = found["Encoder.encode.floatstr"]
    assert lines[inner.start - 1].strip().startswith("def floatstr(")
    assert found["Encoder.encode"].end < inner.start  # the outer chunk ends before it
    assert inner_functions("n.js", "function a() { function b() {} }") == []
    assert inner_functions("bad.py", "def (:") == []


def test_a_question_about_an_inner_function_gets_it_first(tmp_path: Path) -> None:
    root = tmp_path / "enc"
    write(root, "enc.py", NESTED)
    write(root, "other.py", "def encode_all(items):\n    return [str(i) for i in items]\n")
    with git.Repo.init(root) as r:
        r.index.add(["enc.py", "other.py"])
        r.index.commit("initial", author=AUTHOR, committer=AUTHOR)
    packed = pack_repository(
        root, "Which inner function turns NaN floats into text?", count_words, 5_000
    )
    assert packed.excerpts[0].name == "Encoder.encode.floatstr"
