from __future__ import annotations

import os
from pathlib import Path

import git
import pytest

from agentctx.packing import PackedContext, pack_repository, render_file, summary_line
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


def test_packs_every_file_when_the_budget_allows(demo_repo: Path) -> None:
    packed = pack(demo_repo)

    assert sorted(paths(packed)) == sorted(FILES)
    assert packed.omitted == []
    assert packed.tokens == count_words(packed.text)
    assert packed.tokens == sum(item.tokens for item in packed.files)
    with git.Repo(demo_repo) as repo:
        assert packed.commit == repo.head.commit.hexsha


def test_readme_then_docs_then_entry_points_then_the_rest(demo_repo: Path) -> None:
    order = paths(pack(demo_repo))

    assert order[0] == "README.md"
    assert order[1] == "docs/guide.md"
    assert order[2] == "pyproject.toml"
    assert set(order[3:]) == {"src/alpha.py", "src/beta.py", "src/zeta.py"}


def test_relevance_puts_the_file_with_the_rare_word_first(demo_repo: Path) -> None:
    order = paths(pack(demo_repo, "Where do we frobnicate the widgets?"))
    assert order[3:] == ["src/zeta.py", "src/alpha.py", "src/beta.py"]

    order = paths(pack(demo_repo, "How is the input parsed? parse_input"))
    assert order[3] == "src/beta.py"


def test_relevance_matches_split_identifiers(demo_repo: Path) -> None:
    # "loadConfig" splits into load + config, which alpha.py's load_config also holds
    order = paths(pack(demo_repo, "what does loadConfig read?"))
    assert order[3] == "src/alpha.py"


def test_text_has_headers_and_line_numbers(demo_repo: Path) -> None:
    text = pack(demo_repo).text

    assert "=== src/zeta.py (3 lines) ===\n1| def zeta():\n2|     # frobnicate" in text
    assert "=== README.md (3 lines) ===\n1| # Demo\n2|\n3| A small demo project.\n" in text


def test_line_numbers_are_right_aligned() -> None:
    rendering = render_file("a.py", [f"x{i}" for i in range(12)])
    assert rendering.splitlines()[1] == " 1| x0"
    assert rendering.splitlines()[12] == "12| x11"


def test_budget_is_honoured_and_left_out_files_are_reported(demo_repo: Path) -> None:
    kept = ["README.md", "docs/guide.md", "pyproject.toml", "src/zeta.py"]
    budget = sum(rendered_words(demo_repo, rel_path) for rel_path in kept)

    packed = pack(demo_repo, "frobnicate", budget=budget)

    assert packed.tokens <= budget
    # the relevant file takes the last room, ahead of alphabetically earlier ones
    assert paths(packed) == kept
    omitted = {item.path: item for item in packed.omitted}
    assert set(omitted) == {"src/alpha.py", "src/beta.py"}
    for rel_path, item in omitted.items():
        assert item.reason == "budget"
        assert item.tokens == rendered_words(demo_repo, rel_path)
    assert packed.tokens_omitted == sum(item.tokens for item in omitted.values())


def test_a_zero_budget_packs_nothing(demo_repo: Path) -> None:
    packed = pack(demo_repo, budget=0)

    assert packed.text == "" and packed.tokens == 0 and packed.files == []
    assert {item.reason for item in packed.omitted} == {"budget"}


def test_binary_too_large_files_are_left_out_with_reasons(demo_repo: Path) -> None:
    write(demo_repo, "logo.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    write(demo_repo, "data/huge.csv", "a,b\n" * 100)
    write(demo_repo, "notes/latin1.txt", "café\n".encode("latin-1"))

    packed = pack_repository(demo_repo, "q", count_words, 10_000, max_file_bytes=300)

    reasons = {item.path: (item.reason, item.tokens) for item in packed.omitted}
    assert reasons == {
        "logo.png": ("binary", None),
        "data/huge.csv": ("too large", None),
        "notes/latin1.txt": ("binary", None),
    }
    assert sorted(paths(packed)) == sorted(FILES)


def test_a_big_file_that_does_not_fit_is_truncated(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "# Big\n")
    write(tmp_path, "big.py", "".join(f"value_{i} = {i}\n" for i in range(300)))
    budget = 400

    packed = pack(tmp_path, budget=budget)

    assert packed.tokens <= budget
    assert paths(packed) == ["README.md", "big.py"]
    assert "=== big.py (300 lines) ===" in packed.text
    assert "... (truncated, " in packed.text
    [truncated] = packed.omitted
    assert truncated.path == "big.py" and truncated.reason == "truncated"
    full = rendered_words(tmp_path, "big.py")
    assert truncated.tokens == full - packed.files[1].tokens
    assert summary_line(packed) == f"packed 2 files ({packed.tokens:,} tokens, 1 truncated)"


def test_budget_holds_when_the_tokenizer_merges_across_file_seams(demo_repo: Path) -> None:
    # a tokenizer that spends an extra token where one file's rendering meets the next
    def seam_sensitive(text: str) -> int:
        return count_words(text) + text.count("\n===")

    budget = sum(rendered_words(demo_repo, rel_path) for rel_path in FILES)

    packed = pack_repository(demo_repo, "q", seam_sensitive, budget)

    assert packed.tokens == seam_sensitive(packed.text) <= budget
    assert len(packed.files) < len(FILES)
    assert {item.reason for item in packed.omitted} == {"budget"}
    assert len(packed.files) + len(packed.omitted) == len(FILES)


def test_count_tokens_runs_once_per_file_plus_once_for_the_whole(demo_repo: Path) -> None:
    calls: list[str] = []

    def counting(text: str) -> int:
        calls.append(text)
        return count_words(text)

    packed = pack_repository(demo_repo, "q", counting, 10_000)

    assert len(calls) == len(FILES) + 1
    assert calls[-1] == packed.text


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
    assert summary_line(everything) == f"packed 6 files ({everything.tokens:,} tokens)"

    readme = rendered_words(demo_repo, "README.md")
    packed = pack(demo_repo, budget=readme)
    assert summary_line(packed) == (
        f"packed 1 file ({readme:,} tokens); left out 5 files ({packed.tokens_omitted:,} tokens)"
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

    assert paths(packed) == ["sub/na\\xefve.md", "caf\\xe9.py"]
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

    assert paths(pack(tmp_path)) == ["main.py", ".gitignore"]
