from __future__ import annotations

from pathlib import Path

import pytest

from tools.errors import ToolError
from tools.grep import grep

from .support import hostile_files, init_repo, write


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    init_repo(root).close()
    write(root, "app.py", "import os\n\ndef main():\n    return os.getcwd()\n")
    write(root, "pkg/util.py", "def helper():\n    pass\n# TODO: Main thing\n")
    write(root, "README.md", "Run main() to start.\n")
    write(root, ".gitignore", "build/\n")
    write(root, "build/gen.py", "def main(): pass\n")
    return root


def test_lists_matches_as_path_line_text(root: Path) -> None:
    assert grep(root, r"def \w+\(").splitlines() == [
        "app.py:3: def main():",
        "pkg/util.py:1: def helper():",
    ]


def test_path_glob_and_ignore_case(root: Path) -> None:
    assert grep(root, "main", path_glob="*.md") == "README.md:1: Run main() to start."
    assert (
        grep(root, "main", path_glob="pkg/") == "no matches for 'main' in 1 files matching 'pkg/'"
    )
    assert (
        grep(root, "main", path_glob="pkg/", ignore_case=True)
        == "pkg/util.py:3: # TODO: Main thing"
    )


def test_caps_matches_with_a_count_of_the_rest(root: Path) -> None:
    write(root, "many.txt", "hit\n" * 30)
    out = grep(root, "hit", max_matches=5).splitlines()
    assert out[:5] == [f"many.txt:{n}: hit" for n in range(1, 6)]
    assert out[5:] == ["... 25 more matches"]


def test_clips_long_lines_around_the_match(root: Path) -> None:
    write(root, "long.txt", "a" * 1000 + "NEEDLE" + "b" * 1000 + "\n")
    line = grep(root, "NEEDLE")
    assert "NEEDLE" in line
    assert len(line) < 230
    assert line.startswith("long.txt:1: …")


def test_no_matches_and_invalid_regex(root: Path) -> None:
    assert grep(root, "zzz").startswith("no matches for 'zzz' in 4 files")
    with pytest.raises(ToolError, match=r"invalid regex '\(unclosed'"):
        grep(root, "(unclosed")


def test_skips_binary_unreadable_and_huge_files_and_counts_them(root: Path, tmp_path: Path) -> None:
    hostile_files(root, tmp_path / "outside")
    out = grep(root, "x = 1|secret|caf|PNG").splitlines()
    # huge.py, blob.py and latin.py are skipped; the symlink out of the root is never listed
    assert out == [
        "no matches for 'x = 1|secret|caf|PNG' in 7 files",
        "(3 binary, too large or unreadable files skipped)",
    ]


def test_works_in_a_plain_directory(tmp_path: Path) -> None:
    write(tmp_path / "plain", "a.txt", "alpha\nbeta\n")
    assert grep(tmp_path / "plain", "^b") == "a.txt:2: beta"


@pytest.mark.parametrize("glob", ["[z-a].py", "!", "\\"])
def test_an_invalid_path_glob_is_a_tool_error(root: Path, glob: str) -> None:
    with pytest.raises(ToolError, match="invalid path_glob"):
        grep(root, "main", path_glob=glob)
