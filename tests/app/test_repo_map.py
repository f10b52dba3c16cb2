"""The repository map: every file's path and size, code outlined with line numbers, shrunk
step by step to fit its budget and never over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentctx.code_outline import outline_symbols
from agentctx.repo_map import MapEntry, build_map
from tests.app.stdlib_repo import stdlib_repo

PY = '''\
"""A module."""


def top(a):
    return a


@decorated
class Shape(Base):
    def __init__(self):
        pass

    def area(self):
        return 0

    def _cache(self):
        pass


def _helper():
    pass
'''


def words(text: str) -> int:
    return len(text.split())


def symbols(path: str, text: str) -> list[tuple[str, str, int, int]]:
    return [(s.kind, s.name, s.line, s.depth) for s in outline_symbols(path, text)]


def test_python_outline_comes_from_the_syntax_tree() -> None:
    assert symbols("m.py", PY) == [
        ("def", "top", 4, 0),
        ("class", "Shape", 9, 0),  # the class line, not its decorator's
        ("def", "__init__", 10, 1),
        ("def", "area", 13, 1),
        ("def", "_cache", 16, 1),
        ("def", "_helper", 20, 0),
    ]
    assert outline_symbols("broken.py", "def f(:\n") == []
    assert outline_symbols("notes.md", "def f():\n") == []


@pytest.mark.parametrize(
    ("path", "text", "expected"),
    [
        (
            "a.js",
            "export function load(x) {\n}\nclass Store {\n}\nconst parse = (s) => s\n",
            [("def", "load", 1, 0), ("class", "Store", 3, 0), ("def", "parse", 5, 0)],
        ),
        (
            "a.go",
            "package a\n\nfunc (s *S) Run() error {\n}\ntype Config struct {\n",
            [("def", "Run", 3, 0), ("class", "Config", 5, 0)],
        ),
        (
            "a.rs",
            "pub struct Pager {\n}\nimpl Pager {\n    pub fn new() -> Self {\n",
            [("class", "Pager", 1, 0), ("class", "Pager", 3, 0), ("def", "new", 4, 1)],
        ),
        (
            "a.c",
            "static int add(int a, int b) {\n  if (a) {\n  }\n}\nstruct point {\n",
            [("def", "add", 1, 0), ("class", "point", 5, 0)],
        ),
        (
            "a.rb",
            "module Net\n  class Client\n    def get(url)\n",
            [("class", "Net", 1, 0), ("class", "Client", 2, 1), ("def", "get", 3, 1)],
        ),
        ("a.sh", "build() {\n  make\n}\n", [("def", "build", 1, 0)]),
    ],
)
def test_other_languages_get_a_regex_outline(path: str, text: str, expected) -> None:
    assert symbols(path, text) == expected


def entries() -> list[MapEntry]:
    return [
        MapEntry("README.md", 3, 40),
        MapEntry("pkg/shapes.py", 21, 300, outline_symbols("pkg/shapes.py", PY)),
        MapEntry("pkg/__init__.py", 0, 0),
        MapEntry("data/a.json", 10, 200),
        MapEntry("data/b.json", 12, 240),
        MapEntry("logo.png", None, 5000),
    ]


def test_the_full_map_lists_every_file_with_sizes_and_outlines() -> None:
    repo_map = build_map(entries(), 10_000, words)

    assert repo_map.text.splitlines() == [
        "=== Repository map: 6 files, with line counts, and the classes and functions of code "
        "files as name:line ===",
        "README.md (3 lines), logo.png (5 KB)",
        "data/: a.json (10 lines), b.json (12 lines)",
        "pkg/: __init__.py (0 lines)",
        "pkg/shapes.py (21 lines): top:4; class Shape:9 (__init__:10, area:13, _cache:16); "
        "_helper:20",
    ]
    assert repo_map.tokens == words(repo_map.text)
    assert repo_map.notes == [] and repo_map.listed == repo_map.files == 6
    assert repo_map.shown["pkg/shapes.py"] == "outline"
    assert repo_map.shown["logo.png"] == repo_map.shown["data/a.json"] == "path"


def test_a_smaller_budget_shrinks_the_map_step_by_step_and_says_so() -> None:
    full = build_map(entries(), 10_000, words).tokens
    seen: list[str] = []
    for budget in range(full, 0, -1):
        repo_map = build_map(entries(), budget, words)
        assert repo_map.tokens == words(repo_map.text) <= budget
        line = next((ln for ln in repo_map.text.splitlines() if ln.startswith("pkg/shapes")), "")
        if line not in seen:
            seen.append(line)
    assert seen[:5] == [
        "pkg/shapes.py (21 lines): top:4; class Shape:9 (__init__:10, area:13, _cache:16); "
        "_helper:20",
        "pkg/shapes.py (21 lines): top:4; class Shape:9 (area:13); _helper:20",
        "pkg/shapes.py (21 lines): top:4; class Shape:9; _helper:20",
        "pkg/shapes.py (21 lines): top:4; class Shape:9",
        "pkg/shapes.py (21 lines): top; class Shape",
    ]
    smaller = (build_map(entries(), budget, words) for budget in range(full, 0, -1))
    paths_only = next(m for m in smaller if "Shape" not in m.text)
    assert "shapes.py (21 lines)" in paths_only.text and "Shape" not in paths_only.text
    assert paths_only.notes[-1] == "outlines left out"
    assert paths_only.shown["pkg/shapes.py"] == "path"


def test_a_big_directory_collapses_into_one_line() -> None:
    many = [MapEntry("src/main.py", 10, 100, outline_symbols("m.py", "def main():\n    pass\n"))]
    many += [MapEntry(f"runs/r{i}/out{i}.log", 5, 1024) for i in range(60)]
    full = build_map(many, 100_000, words)
    budget = 60

    repo_map = build_map(many, budget, words)

    assert full.tokens > budget >= repo_map.tokens
    assert "runs/: 60 files, 60 KB (not listed)" in repo_map.text
    assert "src/: main.py (10 lines)" in repo_map.text
    assert "runs/ collapsed (60 files)" in repo_map.notes
    assert repo_map.shown["runs/r3/out3.log"] == "" and repo_map.shown["src/main.py"] == "path"


def test_with_no_room_the_list_is_cut_and_says_how_many_files_it_leaves_out() -> None:
    many = [MapEntry(f"f{i:02}.txt", 1, 10) for i in range(40)]

    repo_map = build_map(many, 60, words)

    assert repo_map.tokens == words(repo_map.text) <= 60
    assert repo_map.text.splitlines()[-1] == f"... {40 - repo_map.listed} more files not listed"
    assert 0 < repo_map.listed < 40
    assert repo_map.notes[-1] == f"{40 - repo_map.listed} files not listed (no room)"
    assert build_map(many, 3, words).text == ""  # not even the header fits


def test_the_map_of_a_real_library(tmp_path: Path) -> None:
    from agentctx.packing import pack_repository

    root = stdlib_repo("json", tmp_path)
    packed = pack_repository(root, "What does this library do?", words, 50_000)
    listed = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
                    and ".git" not in p.parts)  # fmt: skip

    assert packed.map is not None and packed.map.listed == packed.map.files == len(listed)
    assert packed.map.notes == []
    lines = packed.text.split("\n\n=== ", 1)[0].splitlines()
    assert all(any(path.rsplit("/", 1)[-1] in line for line in lines) for path in listed)
    # each name:line of decoder.py points at that definition
    [row] = [line for line in lines if line.startswith("json/decoder.py")]
    source = (root / "json" / "decoder.py").read_text().splitlines()
    for item in row.split(": ", 1)[1].replace("(", "; ").replace(")", "").split("; "):
        for part in item.split(", "):
            name, _, number = part.removeprefix("class ").rpartition(":")
            text = source[int(number) - 1].strip()
            assert text.startswith((f"def {name}(", f"class {name}")), (part, text)
    assert "class JSONDecoder" in row and "decode:" in row
