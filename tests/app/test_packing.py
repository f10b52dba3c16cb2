from __future__ import annotations

import os
from pathlib import Path

import git
import pytest

from agentctx.packing import PackedContext, pack_repository, relevance, render_file, summary_line
from tests.app.stdlib_repo import stdlib_repo
from tests.tools.support import write
from tools.errors import RootError

AUTHOR = git.Actor("Test", "test@example.com")


def count_words(text: str) -> int:
    return len(text.split())


def rendered_words(root: Path, rel_path: str) -> int:
    lines = (root / rel_path).read_text().splitlines()
    return count_words(render_file(rel_path, lines))


FILES = {
    "README.md": "# Demo\n\nA small demo project.\n",
    "docs/guide.md": "Guide\n\nRun the tool.\n",
    "pyproject.toml": '[project]\nname = "demo"\n',
    "src/alpha.py": "def alpha():\n    return load_config()\n",
    "src/beta.py": "def beta():\n    return parse_input()\n",
    "src/zeta.py": "def zeta():\n    # frobnicate the widgets before saving\n    return frobnicate()\n",
}


@pytest.fixture
def demo_repo(tmp_path: Path) -> Path:
    root = tmp_path / "demo"
    root.mkdir()
    for rel_path, content in FILES.items():
        write(root, rel_path, content)
    with git.Repo.init(root) as repo:
        repo.index.add(list(FILES))
        repo.index.commit("initial", author=AUTHOR, committer=AUTHOR)
    return root


def pack(root: Path, question: str = "what is this?", budget: int = 10_000) -> PackedContext:
    return pack_repository(root, question, count_words, budget)


def paths(packed: PackedContext) -> list[str]:
    return [item.path for item in packed.files]


def read_texts(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file()}


def files_of(packed: PackedContext) -> str:
    """The packed text after the map."""
    assert packed.map is not None
    return packed.text.split("\n\n", 1)[1] if packed.map.tokens else packed.text


def test_packs_the_map_then_every_file_when_the_budget_allows(demo_repo: Path) -> None:
    packed = pack(demo_repo)

    assert sorted(paths(packed)) == sorted(FILES)
    assert packed.omitted == []
    assert packed.tokens == count_words(packed.text)
    assert packed.map is not None and packed.map.listed == packed.map.files == len(FILES)
    assert packed.tokens == packed.map.tokens + sum(item.tokens for item in packed.files)
    assert packed.text.startswith("=== Repository map: 6 files")
    assert "src/zeta.py (3 lines): zeta:1" in packed.text
    assert all(item.packed == "full" for item in packed.files)
    with git.Repo(demo_repo) as repo:
        assert packed.commit == repo.head.commit.hexsha


def test_an_overview_question_ranks_the_readme_then_docs_then_the_manifest(
    demo_repo: Path,
) -> None:
    order = paths(pack(demo_repo, "What does this project do?"))

    assert order[:3] == ["README.md", "docs/guide.md", "pyproject.toml"]
    # the repository's own name makes no word that picks a file either
    assert paths(pack(demo_repo, "What is demo for?"))[0] == "README.md"


def test_an_overview_question_gets_the_overview_budget_and_a_map_of_every_file(
    tmp_path: Path,
) -> None:
    from agentctx.packing import OVERVIEW_TOKENS

    write(tmp_path, "README.md", "# Demo\n\nA demo project that frobnicates widgets.\n")
    for i in range(40):  # ~40K words: more than the overview budget, less than the window's
        write(tmp_path, f"src/part{i}.py", f"def part{i}():\n" + "    x = 1  # widget\n" * 250)
    budget, question = 100_000, "What does this project do?"

    capped = pack_repository(tmp_path, question, count_words, budget, cap_overview=True)
    assert capped.budget == OVERVIEW_TOKENS and capped.tokens <= OVERVIEW_TOKENS
    assert paths(capped)[0] == "README.md"
    assert capped.map is not None and capped.map.listed == capped.map.files == 41
    assert any(f"gets {OVERVIEW_TOKENS:,} tokens" in note for note in capped.map.notes)
    # without the cap (the caller gave --context-tokens), and for a question about a part
    uncapped = pack_repository(tmp_path, question, count_words, budget)
    assert uncapped.budget == budget and uncapped.tokens > OVERVIEW_TOKENS
    part = pack_repository(tmp_path, "What does part7 return?", count_words, budget,
                           cap_overview=True)  # fmt: skip
    assert part.budget == budget and paths(part)[0] == "src/part7.py"
    assert not any("whole project" in note for note in part.map.notes)


def test_relevance_ranks_across_kinds_with_no_docs_first(demo_repo: Path) -> None:
    order = paths(pack(demo_repo, "Where do we frobnicate the widgets?"))
    assert order[0] == "src/zeta.py"

    order = paths(pack(demo_repo, "How is the input parsed? parse_input"))
    assert order[0] == "src/beta.py"


def test_relevance_matches_split_identifiers(demo_repo: Path) -> None:
    # "loadConfig" splits into load + config, which alpha.py's load_config also holds
    order = paths(pack(demo_repo, "what does loadConfig read?"))
    assert order[0] == "src/alpha.py"


def test_symbol_names_count_in_relevance(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "# Shapes\n\nA polygon library; Polygon areas.\n" * 3)
    write(tmp_path, "geometry/core.py", "class Polygon:\n    def area(self):\n        return 0\n")
    write(tmp_path, "geometry/other.py", "# polygon helpers\nX = 1\n")

    assert paths(pack(tmp_path, "Where is Polygon defined?"))[0] == "geometry/core.py"


def test_word_forms_meet_and_machine_output_counts_less(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "# Pool\n\nA memory pool.\n")
    write(tmp_path, "pool/pages.py", 'def allocate(n):\n    """Allocation of n pages."""\n')
    rows = "".join(f'  "kv_cache_allocated_{i}": {i},\n' for i in range(12))
    write(tmp_path, "runs/result.json", "{\n" + rows + "}\n")
    write(tmp_path, "pool/kv_cache.py", "class KVCache:\n    def allocate(self):\n        pass\n")
    question = "Where is the KV cache allocated?"

    # "allocated" meets allocate and Allocation; the JSON says the words more often, but it is
    # data a program wrote
    raw = relevance(read_texts(tmp_path), question)
    assert raw["runs/result.json"] > raw["pool/kv_cache.py"] > raw["pool/pages.py"] > 0
    assert paths(pack(tmp_path, question))[0] == "pool/kv_cache.py"
    assert paths(pack(tmp_path, "How are pages allocated?"))[0] == "pool/pages.py"


def test_accents_do_not_change_what_matches(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "# Notes\n\nA battle diary.\n")
    write(tmp_path, "days/borodino.txt", "Kutúzov rode out before dawn.\n")
    write(tmp_path, "days/moscow.txt", "Everyone left Moscow.\n")
    write(tmp_path, "days/mozhaysk.txt", "The battle of Borodinó began at six.\n")

    assert paths(pack(tmp_path, "When did the battle of Borodino begin?"))[0] == (
        "days/mozhaysk.txt"
    )
    assert paths(pack(tmp_path, "What did KUTUZOV do?"))[0] == "days/borodino.txt"


BOILERPLATE = {
    ".github/ISSUE_TEMPLATE/bug_report.md": "Describe the class Engine bug. Engine version?\n",
    ".github/ISSUE_TEMPLATE/feature.md": "Which Engine feature do you want?\n",
    ".github/pull_request_template.md": "Engine changes: describe them.\n",
    "docs/Makefile": "# Makefile for Sphinx docs of Engine\nhtml:\n\tsphinx-build . _build\n",
    "src/demo/py.typed": "",
    "LICENSE": "MIT License\n\nEngine copyright holders...\n",
    "package-lock.json": '{"name": "engine", "lockfileVersion": 3}\n',
    "vendor/six.py": "class Engine:\n    pass\n",
    # what a build wrote: a copy of the sources and a bundle
    "build/lib/demo/engine.py": "class Engine:\n    def step(self):\n        pass\n",
    "dist/engine.js": "class Engine { step() {} }\n",
}


def test_boilerplate_never_displaces_the_best_files(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "# Demo\n\nThe Engine runs jobs. See docs.\n")
    write(tmp_path, "docs/engine.md", "# The Engine\n\n" + "The Engine schedules work.\n" * 20)
    definition = "class Engine:\n" + "".join(
        f"    def step_{i}(self):\n        pass\n" for i in range(40)
    )
    write(tmp_path, "src/demo/engine.py", definition)
    for rel_path, text in BOILERPLATE.items():
        write(tmp_path, rel_path, text)
    map_only = pack_repository(tmp_path, "q", count_words, 10_000, map_budget=10_000).map
    assert map_only is not None
    best = ["src/demo/engine.py", "docs/engine.md", "README.md"]
    budget = map_only.tokens + sum(rendered_words(tmp_path, p) for p in best)

    packed = pack_repository(
        tmp_path, "Where is the class Engine defined?", count_words, budget, map_budget=budget
    )

    assert paths(packed)[0] == "src/demo/engine.py"
    assert set(best) <= set(paths(packed))
    assert not set(BOILERPLATE) & set(paths(packed))
    # with room for everything, boilerplate still comes after every other file
    everything = paths(pack(tmp_path, "Where is the class Engine defined?", budget=100_000))
    assert set(everything[-len(BOILERPLATE) :]) == set(BOILERPLATE)


def test_text_has_headers_and_line_numbers(demo_repo: Path) -> None:
    text = files_of(pack(demo_repo))

    assert "=== src/zeta.py (3 lines) ===\n1| def zeta():\n2|     # frobnicate" in text
    assert "=== README.md (3 lines) ===\n1| # Demo\n2|\n3| A small demo project.\n" in text


def test_line_numbers_are_right_aligned() -> None:
    rendering = render_file("a.py", [f"x{i}" for i in range(12)])
    assert rendering.splitlines()[1] == " 1| x0"
    assert rendering.splitlines()[12] == "12| x11"


def test_budget_is_honoured_and_left_out_files_are_in_the_map(demo_repo: Path) -> None:
    map_tokens = pack(demo_repo).map.tokens
    kept = ["src/zeta.py", "README.md"]
    budget = map_tokens + sum(rendered_words(demo_repo, rel_path) for rel_path in kept)

    packed = pack_repository(demo_repo, "frobnicate", count_words, budget, map_budget=budget)

    assert packed.tokens <= budget and packed.map.listed == len(FILES)
    assert paths(packed) == kept
    omitted = {item.path: item for item in packed.omitted}
    assert set(omitted) == set(FILES) - set(kept)
    for rel_path, item in omitted.items():
        assert item.reason == "budget"
        assert item.tokens == rendered_words(demo_repo, rel_path)
    assert omitted["src/alpha.py"].map == "outline" and omitted["docs/guide.md"].map == "path"
    assert packed.tokens_omitted == sum(item.tokens for item in omitted.values())


def test_a_zero_budget_packs_nothing(demo_repo: Path) -> None:
    packed = pack(demo_repo, budget=0)

    assert packed.text == "" and packed.tokens == 0 and packed.files == []
    assert {item.reason for item in packed.omitted} == {"budget"}
    assert packed.map.tokens == 0 and packed.warnings


def test_binary_too_large_files_are_in_the_map_with_reasons(demo_repo: Path) -> None:
    write(demo_repo, "logo.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    write(demo_repo, "data/huge.csv", "a,b\n" * 100)
    write(demo_repo, "notes/latin1.txt", "café\n".encode("latin-1"))

    packed = pack_repository(demo_repo, "q", count_words, 10_000, max_file_bytes=300)

    reasons = {item.path: (item.reason, item.tokens, item.map) for item in packed.omitted}
    assert reasons == {
        "logo.png": ("binary", None, "path"),
        "data/huge.csv": ("too large", None, "path"),
        "notes/latin1.txt": ("binary", None, "path"),
    }
    assert sorted(paths(packed)) == sorted(FILES)
    assert "logo.png (16 B)" in packed.text and "huge.csv (400 B)" in packed.text


def test_a_big_relevant_file_that_does_not_fit_is_truncated(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "# Big\n")
    write(tmp_path, "big.py", "".join(f"value_{i} = {i}\n" for i in range(300)))
    budget = 400

    packed = pack(tmp_path, "what is value_7?", budget=budget)

    assert packed.tokens <= budget
    assert paths(packed) == ["big.py", "README.md"]
    assert "=== big.py (300 lines) ===" in packed.text
    assert "... (truncated, " in packed.text
    cut = packed.files[0]
    assert cut.packed == "truncated" and 20 <= cut.lines < cut.total_lines == 300
    [truncated] = packed.omitted
    assert truncated.path == "big.py" and truncated.reason == "truncated"
    full = rendered_words(tmp_path, "big.py")
    assert truncated.tokens == full - packed.files[0].tokens
    assert summary_line(packed) == (
        f"packed 2 files ({sum(f.tokens for f in packed.files):,} tokens, 1 truncated) and a "
        f"map of all 2 files ({packed.map.tokens:,} tokens)"
    )


def test_budget_holds_when_the_tokenizer_merges_across_file_seams(demo_repo: Path) -> None:
    # a tokenizer that spends an extra token where one file's rendering meets the next
    def seam_sensitive(text: str) -> int:
        return count_words(text) + text.count("\n===")

    map_tokens = pack_repository(demo_repo, "q", seam_sensitive, 10_000).map.tokens
    budget = map_tokens + sum(rendered_words(demo_repo, rel_path) for rel_path in FILES)

    packed = pack_repository(demo_repo, "q", seam_sensitive, budget, map_budget=budget)

    assert packed.tokens == seam_sensitive(packed.text) <= budget
    assert len(packed.files) < len(FILES)
    assert {item.reason for item in packed.omitted} == {"budget"}
    assert len(packed.files) + len(packed.omitted) == len(FILES)


def test_count_tokens_runs_once_per_file_plus_the_map_and_the_whole(demo_repo: Path) -> None:
    calls: list[str] = []

    def counting(text: str) -> int:
        calls.append(text)
        return count_words(text)

    packed = pack_repository(demo_repo, "q", counting, 10_000)

    assert len(calls) == 1 + len(FILES) + 1  # the map fits at once
    assert calls[0].startswith("=== Repository map") and calls[-1] == packed.text


def test_the_map_is_the_same_prefix_for_every_question(tmp_path: Path) -> None:
    root = stdlib_repo("json", tmp_path)

    def packed(question: str, budget: int) -> PackedContext:
        return pack_repository(root, question, count_words, budget, map_budget=3_000)

    first = packed("What does this library do?", 6_000)
    second = packed("Where is JSONDecodeError raised for a bad escape?", 5_800)
    prefix = first.text.split("\n\n=== ", 1)[0]

    assert second.text.startswith(prefix + "\n\n=== ") and first.text != second.text
    assert "json/decoder.py" in paths(second)[:2]
    assert first.map.listed == first.map.files


def test_a_real_library_packs_what_defines_the_name_asked_about(tmp_path: Path) -> None:
    root = stdlib_repo("json", tmp_path)

    packed = pack_repository(root, "Where is the class JSONDecoder defined?", count_words, 6_000)

    assert paths(packed)[0] == "json/decoder.py"
    assert packed.files[0].packed == "full"
    overview = pack_repository(root, "What does this package do?", count_words, 6_000)
    assert paths(overview)[0] == "json/__init__.py"


def test_plain_directory_has_no_commit(tmp_path: Path) -> None:
    write(tmp_path, "main.py", "print('hi')\n")
    assert pack(tmp_path).commit is None


def test_empty_repository_raises_root_error(tmp_path: Path) -> None:
    git.Repo.init(tmp_path).close()
    with pytest.raises(RootError, match="repository has no text files"):
        pack(tmp_path)


def test_repository_of_only_binary_files_raises_root_error(tmp_path: Path) -> None:
    write(tmp_path, "image.bin", b"\0\1\2")
    with pytest.raises(RootError, match="repository has no text files"):
        pack(tmp_path)


def test_not_a_directory_raises_root_error(tmp_path: Path) -> None:
    write(tmp_path, "file.txt", "x\n")
    with pytest.raises(RootError, match="not a directory"):
        pack(tmp_path / "file.txt")
    with pytest.raises(RootError, match="does not exist"):
        pack(tmp_path / "missing")


def test_summary_line(demo_repo: Path) -> None:
    everything = pack(demo_repo)
    in_files = sum(f.tokens for f in everything.files)
    assert summary_line(everything) == (
        f"packed 6 files ({in_files:,} tokens) and a map of all 6 files "
        f"({everything.map.tokens:,} tokens)"
    )

    readme = rendered_words(demo_repo, "README.md")
    budget = everything.map.tokens + readme
    packed = pack_repository(demo_repo, "what is this?", count_words, budget, map_budget=budget)
    assert summary_line(packed) == (
        f"packed 1 file ({readme:,} tokens) and a map of all 6 files "
        f"({everything.map.tokens:,} tokens); 5 files only in the map "
        f"({packed.tokens_omitted:,} tokens)"
    )


# --- names that are not UTF-8, hostile config, unusable .gitignore lines ---


def word_level_tokenizer():
    """A real tokenizer: like a model's, it refuses text that holds surrogates."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, "[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return lambda text: len(tokenizer.encode(text).ids)


@pytest.mark.parametrize("in_git", [True, False], ids=["git", "plain directory"])
def test_names_that_are_not_utf8_are_packed_printable(tmp_path: Path, in_git: bool) -> None:
    root = tmp_path / "repo"
    write(root, os.fsdecode(b"caf\xe9.py"), "cafe = 1\n")
    write(root, os.fsdecode(b"sub/na\xefve.md"), "# Naive\n")
    write(root, os.fsdecode(b"latin\xe9.txt"), "caf\xe9\n".encode("latin-1"))
    if in_git:
        with git.Repo.init(root) as repo:
            repo.git.add(os.fsdecode(b"caf\xe9.py"))  # tracked; the others untracked
            # the git CLI: GitPython's index cannot read a name that is not UTF-8
            identity = ["-c", "user.name=Test", "-c", "user.email=test@example.com"]
            repo.git.execute(["git", *identity, "commit", "-qm", "initial"])

    packed = pack_repository(root, "what is cafe?", word_level_tokenizer(), 10_000)

    assert sorted(paths(packed)) == ["caf\\xe9.py", "sub/na\\xefve.md"]
    assert "=== caf\\xe9.py (1 line) ===\n1| cafe = 1\n" in packed.text
    assert "=== sub/na\\xefve.md (1 line) ===" in packed.text
    assert [(item.path, item.reason) for item in packed.omitted] == [("latin\\xe9.txt", "binary")]
    packed.text.encode("utf-8")
    assert (packed.commit is not None) == in_git


def test_packing_runs_no_fsmonitor(demo_repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with git.Repo(demo_repo) as repo, repo.config_writer() as config:
        config.set_value("core", "fsmonitor", f"touch '{marker}'; false")

    packed = pack(demo_repo)

    assert sorted(paths(packed)) == sorted(FILES)
    assert not marker.exists()


@pytest.mark.parametrize("bad", ["[z-a]", "\\", "!"])
def test_a_plain_directory_with_gitignore_lines_git_cannot_use(tmp_path: Path, bad: str) -> None:
    write(tmp_path, ".gitignore", f"{bad}\n*.log\n")
    write(tmp_path, "main.py", "print('hi')\n")
    write(tmp_path, "debug.log", "noise\n")

    assert paths(pack(tmp_path)) == ["main.py", ".gitignore"]  # (.gitignore: boilerplate)


def test_files_an_agentctxignore_names_are_not_packed_nor_in_the_map(demo_repo: Path) -> None:
    write(demo_repo, ".agentctxignore", "src/zeta.py\n")
    packed = pack(demo_repo, "Where are the widgets frobnicated?")
    assert "frobnicate" not in packed.text  # zeta.py's body
    listed = [f.path for f in packed.files] + [o.path for o in packed.omitted]
    assert "src/zeta.py" not in listed and "src/alpha.py" in listed
