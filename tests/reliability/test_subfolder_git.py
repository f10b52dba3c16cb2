"""With the root at repo/sub, no git tool prints a file, a name or a tree from outside sub."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.registry import run_tool

from .support import UNFORESEEN, commit_all, git, make_repo

OUTSIDE = "PRIVATE-CONTENT"
README = "README-AT-THE-TOP"


@pytest.fixture
def sub(tmp_path: Path) -> Path:
    repo = make_repo(
        tmp_path / "repo",
        {
            "private.txt": f"{OUTSIDE}\n",
            "README.md": f"{README}\n",
            "sub/app.py": "def main():\n    return 1\n",
        },
    )
    (repo / "other").mkdir()
    (repo / "other/data.py").write_text("X = 'moved in'\n")
    commit_all(repo, "Add other data")  # a commit outside the root only
    # a second commit touching both sides, and a move from outside into sub
    (repo / "private.txt").write_text(f"{OUTSIDE} v2\n")
    (repo / "sub/app.py").write_text("def main():\n    return 2\n")
    git(repo, "mv", "other/data.py", "sub/data.py")
    commit_all(repo, "Change both sides")
    git(repo, "tag", "blobtag", "HEAD:private.txt")
    git(repo, "tag", "treetag", "HEAD^{tree}")
    return repo / "sub"


def blob(sub: Path, spec: str) -> str:
    return git(sub.parent, "rev-parse", spec).strip()


def assert_nothing_outside(result: str) -> None:
    assert OUTSIDE not in result and README not in result, result
    assert "other/" not in result, result  # the model names private.txt itself
    assert not result.startswith(UNFORESEEN), result


@pytest.mark.parametrize(
    "rev",
    ["HEAD:private.txt", "HEAD:./private.txt", "HEAD:README.md", "HEAD:../private.txt",
     "HEAD:sub/../../private.txt", "HEAD^{tree}", "HEAD~1^{tree}", "blobtag", "treetag",
     "HEAD:/private.txt", ":private.txt", ":0:README.md", "HEAD^{tree}:private.txt"],
)  # fmt: skip
def test_show_of_a_rev_path_outside_the_root_is_refused(sub: Path, rev: str) -> None:
    result = run_tool(sub, "git_show", {"rev": rev})
    assert result.startswith("error: "), result
    assert_nothing_outside(result)


def test_show_of_objects_named_by_sha_is_refused(sub: Path) -> None:
    for spec in ["HEAD:private.txt", "HEAD^{tree}", "HEAD:other"]:
        sha = blob(sub, spec) if spec != "HEAD:other" else blob(sub, "HEAD~1:other")
        for arguments in [{"rev": sha}, {"rev": sha, "path": "app.py"}, {"rev": f"{sha}:"}]:
            result = run_tool(sub, "git_show", arguments)
            assert result.startswith("error: ") and "not a commit" in result, result
            assert_nothing_outside(result)


def test_a_rev_path_is_read_relative_to_the_root(sub: Path) -> None:
    assert run_tool(sub, "git_show", {"rev": "HEAD:app.py"}).startswith(
        "app.py at HEAD (2 lines)\n   1| def main():"
    )
    assert "return 1" in run_tool(sub, "git_show", {"rev": "HEAD~1:./app.py"})
    listing = run_tool(sub, "git_show", {"rev": "HEAD:"})
    assert listing == ". at HEAD: 2 entries\napp.py\ndata.py"
    # braces may hold a colon: the commit found by its message
    found = run_tool(sub, "git_show", {"rev": "HEAD^{/Change both: *}", "path": "app.py"})
    assert found.startswith("error: unknown revision") or "return 2" in found


def test_show_of_a_commit_shows_only_the_root(sub: Path) -> None:
    for rev in ["HEAD", "HEAD~2", ":/Change"]:
        result = run_tool(sub, "git_show", {"rev": rev})
        assert "sub/app.py" in result
        assert_nothing_outside(result)
    outside_only = run_tool(sub, "git_show", {"rev": "HEAD~1"})
    assert outside_only.endswith("(HEAD~1) changes no file under the root")


def test_diff_log_and_blame_stay_in_the_root(sub: Path) -> None:
    (sub.parent / "private.txt").write_text(f"{OUTSIDE} v3 uncommitted\n")
    (sub.parent / "new-outside.txt").write_text(f"{OUTSIDE}\n")
    calls = [
        ("git_diff", {}),
        ("git_diff", {"rev_a": "HEAD~1"}),
        ("git_diff", {"rev_a": "HEAD~1", "rev_b": "HEAD"}),
        ("git_diff", {"rev_a": "HEAD:private.txt"}),
        ("git_diff", {"rev_a": "HEAD~1:private.txt", "rev_b": "HEAD:private.txt"}),
        ("git_diff", {"rev_a": blob(sub, "HEAD~1:private.txt"), "rev_b": blob(sub, "HEAD:private.txt")}),
        ("git_diff", {"rev_a": "HEAD^{tree}", "rev_b": "HEAD~1^{tree}"}),
        ("git_diff", {"path": "../private.txt"}),
        ("git_log", {}),
        ("git_log", {"path": "../private.txt"}),
        ("git_log", {"path": ":(top)private.txt"}),
        ("git_log", {"path": "data.py"}),
        ("git_blame", {"path": "../private.txt"}),
        ("git_blame", {"path": ":(top)private.txt"}),
        ("git_blame", {"path": "data.py"}),
        ("grep", {"pattern": "PRIVATE", "path_glob": "../*"}),
        ("read_file", {"path": "../private.txt"}),
        ("list_files", {}),
    ]  # fmt: skip
    for name, arguments in calls:
        result = run_tool(sub, name, arguments)
        assert_nothing_outside(result)
    # data.py came from outside: its content is the root's now, its old path is not shown
    assert "X = '" in run_tool(sub, "git_blame", {"path": "data.py"})
    assert "Change both sides" in run_tool(sub, "git_log", {"path": "data.py"})
    # the history of its old path, outside the root, is not followed
    assert "Add other data" not in run_tool(sub, "git_log", {"path": "data.py"})
    assert "Add other data" not in run_tool(sub, "git_log", {})
