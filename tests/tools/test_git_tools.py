from __future__ import annotations

import os
import subprocess
from pathlib import Path

import git
import pytest

from tools.errors import (
    BinaryFileError,
    FileTooLargeError,
    PathEscapeError,
    RootError,
    ToolError,
)
from tools.git_tools import git_blame, git_diff, git_log, git_show

from .support import commit, hostile_files, init_repo, write


@pytest.fixture
def repo_root(tmp_path: Path) -> Path:
    """Two commits: app.py created, then changed; notes.md added in the second."""
    root = tmp_path / "repo"
    with init_repo(root) as repo:
        write(root, "app.py", "def main():\n    return 1\n")
        commit(repo, "Add app", "app.py")
        write(root, "app.py", "def main():\n    return 2\n")
        write(root, "pkg/notes.md", "# Notes\n")
        commit(repo, "Change app, add notes", "app.py", "pkg/notes.md")
    return root


@pytest.fixture
def empty_repo(tmp_path: Path) -> Path:
    root = tmp_path / "empty"
    init_repo(root).close()
    write(root, "a.py", "a = 1\n")
    return root


def sha(root: Path, rev: str = "HEAD") -> str:
    with git.Repo(root) as repo:
        return repo.commit(rev).hexsha


# --- git_log ---


def test_log_lists_commits_newest_first(repo_root: Path) -> None:
    assert git_log(repo_root).splitlines() == [
        f"{sha(repo_root)[:7]} 2024-03-01 Ada Lovelace: Change app, add notes",
        f"{sha(repo_root, 'HEAD~1')[:7]} 2024-03-01 Ada Lovelace: Add app",
    ]


def test_log_for_a_path_and_a_cap(repo_root: Path) -> None:
    assert git_log(repo_root, "pkg/notes.md").endswith("Change app, add notes")
    assert len(git_log(repo_root, "pkg").splitlines()) == 1
    out = git_log(repo_root, max_count=1).splitlines()
    assert out[1] == "... more commits; raise max_count (now 1)"


def test_log_of_a_subdirectory_root_covers_only_it(repo_root: Path) -> None:
    assert git_log(repo_root / "pkg").splitlines()[0].endswith("Change app, add notes")
    assert len(git_log(repo_root / "pkg").splitlines()) == 1
    assert git_log(repo_root / "pkg", "notes.md").endswith("Change app, add notes")


def test_log_of_an_untouched_path(repo_root: Path) -> None:
    write(repo_root, "new.py")
    assert git_log(repo_root, "new.py") == "no commits touch new.py"


# --- git_show ---


def test_show_a_commit_with_message_and_patch(repo_root: Path) -> None:
    out = git_show(repo_root)
    assert out.startswith(f"commit {sha(repo_root)}")
    assert "Change app, add notes" in out
    assert "-    return 1\n+    return 2" in out
    assert "pkg/notes.md" in out


def test_show_a_file_at_a_revision(repo_root: Path) -> None:
    assert git_show(repo_root, "HEAD~1", "app.py").splitlines() == [
        "app.py at HEAD~1 (2 lines)",
        "   1| def main():",
        "   2|     return 1",
    ]


def test_show_truncates_at_max_chars(repo_root: Path) -> None:
    out = git_show(repo_root, max_chars=50)
    assert out.splitlines()[-1].startswith("... truncated at 50 of")


def test_show_bad_revisions(repo_root: Path) -> None:
    with pytest.raises(ToolError, match="unknown revision: nope"):
        git_show(repo_root, "nope")
    # an option in disguise must never reach git (--output writes a file)
    with pytest.raises(ToolError, match="bad revision"):
        git_show(repo_root, f"--output={repo_root / 'pwned'}")
    assert not (repo_root / "pwned").exists()
    with pytest.raises(ToolError, match="does not exist in 'HEAD'"):
        git_show(repo_root, "HEAD", "missing.py")


def test_show_refuses_binary_and_huge_files_in_history(repo_root: Path, tmp_path: Path) -> None:
    hostile_files(repo_root, tmp_path / "outside")
    with git.Repo(repo_root) as repo:
        commit(repo, "Add hostile files", "blob.py", "latin.py", "huge.py")
    with pytest.raises(ToolError, match="not a text file: blob.py at HEAD"):
        git_show(repo_root, "HEAD", "blob.py")
    with pytest.raises(ToolError, match="not a text file: latin.py at HEAD"):
        git_show(repo_root, "HEAD", "latin.py")
    with pytest.raises(FileTooLargeError, match="huge.py at HEAD"):
        git_show(repo_root, "HEAD", "huge.py")


# --- git_diff ---


def test_diff_of_the_working_tree_against_head(repo_root: Path) -> None:
    assert git_diff(repo_root) == "no differences"
    index_before = (repo_root / ".git" / "index").read_bytes()
    write(repo_root, "app.py", "def main():\n    return 3\n")
    write(repo_root, "fresh.py", "new = 1\n")
    out = git_diff(repo_root)
    assert "-    return 2\n+    return 3" in out
    assert out.endswith("untracked files: fresh.py")
    # read-only: not even git's index is refreshed
    assert (repo_root / ".git" / "index").read_bytes() == index_before


def test_diff_between_revisions_and_for_a_path(repo_root: Path) -> None:
    out = git_diff(repo_root, "HEAD~1", "HEAD")
    assert "+    return 2" in out
    assert "notes.md" in out
    assert "notes.md" not in git_diff(repo_root, "HEAD~1", "HEAD", path="app.py")
    assert "+    return 2" in git_diff(repo_root, "HEAD~1")  # against the working tree


def test_diff_argument_errors(repo_root: Path) -> None:
    with pytest.raises(ToolError, match="rev_b needs rev_a"):
        git_diff(repo_root, rev_b="HEAD")
    with pytest.raises(ToolError, match="unknown revision: v9"):
        git_diff(repo_root, "v9")


def test_diff_does_not_run_a_configured_external_diff(repo_root: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with git.Repo(repo_root) as repo, repo.config_writer() as config:
        config.set_value("diff", "external", f"touch {marker}")
    write(repo_root, "app.py", "changed\n")
    assert "+changed" in git_diff(repo_root)
    assert not marker.exists()


# --- git_blame ---


def test_blame_lines(repo_root: Path) -> None:
    first, second = sha(repo_root, "HEAD~1")[:8], sha(repo_root)[:8]
    assert git_blame(repo_root, "app.py").splitlines() == [
        "app.py (lines 1-2 of 2)",
        f"{first} Ada Lovelace 2024-03-01    1| def main():",
        f"{second} Ada Lovelace 2024-03-01    2|     return 2",
    ]
    assert git_blame(repo_root, "app.py", start=2).splitlines()[1].endswith("2|     return 2")


def test_blame_marks_uncommitted_lines_and_checks_the_range(repo_root: Path) -> None:
    write(repo_root, "app.py", "def main():\n    return 2\nextra = 1\n")
    assert "uncommit" in git_blame(repo_root, "app.py", 3, 3).splitlines()[1]
    with pytest.raises(ToolError, match="past the end"):
        git_blame(repo_root, "app.py", start=9)
    with pytest.raises(ToolError, match="before start"):
        git_blame(repo_root, "app.py", start=2, end=1)


def test_blame_of_an_untracked_file(repo_root: Path) -> None:
    write(repo_root, "new.py")
    with pytest.raises(ToolError, match="not tracked by git: new.py"):
        git_blame(repo_root, "new.py")


def test_blame_refuses_binary_and_huge_files(repo_root: Path, tmp_path: Path) -> None:
    hostile_files(repo_root, tmp_path / "outside")
    with pytest.raises(BinaryFileError):
        git_blame(repo_root, "blob.py")
    with pytest.raises(BinaryFileError):
        git_blame(repo_root, "latin.py")
    with pytest.raises(FileTooLargeError):
        git_blame(repo_root, "huge.py")


# --- confinement, empty and missing repositories ---


@pytest.mark.parametrize(
    "call",
    [
        lambda root, path: git_log(root, path),
        lambda root, path: git_show(root, "HEAD", path),
        lambda root, path: git_diff(root, path=path),
        lambda root, path: git_blame(root, path),
    ],
    ids=["log", "show", "diff", "blame"],
)
def test_paths_are_confined(repo_root: Path, tmp_path: Path, call) -> None:
    hostile_files(repo_root, tmp_path / "outside")
    for path in ["../outside/secret.py", str(tmp_path / "outside" / "secret.py"), "leak.py"]:
        with pytest.raises(PathEscapeError):
            call(repo_root, path)


def test_a_subdirectory_root_cannot_reach_the_rest_of_its_repo(repo_root: Path) -> None:
    with pytest.raises(PathEscapeError):
        git_show(repo_root / "pkg", "HEAD", "../app.py")
    assert "app.py" not in git_show(repo_root / "pkg")


def test_a_repository_with_no_commits(empty_repo: Path) -> None:
    for call in [
        lambda: git_log(empty_repo),
        lambda: git_show(empty_repo),
        lambda: git_blame(empty_repo, "a.py"),
        lambda: git_diff(empty_repo),
    ]:
        with pytest.raises(ToolError, match="^the repository has no commits yet$"):
            call()


def test_a_directory_that_is_not_a_repository(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    write(plain, "a.py")
    for call in [git_log, git_show, git_diff, lambda root: git_blame(root, "a.py")]:
        with pytest.raises(ToolError, match=f"^not a git repository: {plain}$"):
            call(plain)
    with pytest.raises(RootError):
        git_log(tmp_path / "missing")


def test_a_directory_its_repository_ignores_is_not_a_repository(repo_root: Path) -> None:
    write(repo_root, ".gitignore", "vendor/\n")
    write(repo_root, "vendor/lib.py")
    with git.Repo(repo_root) as repo:
        commit(repo, "Ignore vendor", ".gitignore")
    with pytest.raises(ToolError, match="not a git repository"):
        git_log(repo_root / "vendor")


# --- names that are not UTF-8 ---


def test_a_name_that_is_not_utf8_reaches_every_git_tool(repo_root: Path) -> None:
    name = os.fsdecode(b"caf\xe9.py")  # a Latin-1 name, as list_files shows it: caf\xe9.py
    write(repo_root, name, "cafe = 1\n")
    subprocess.run(["git", "-C", str(repo_root), "add", "--", name], check=True)
    subprocess.run(
        ["git", "-C", str(repo_root), "-c", "user.name=Ada", "-c", "user.email=a@b"]
        + ["commit", "-qm", "Add cafe"],
        check=True,
    )
    write(repo_root, name, "cafe = 2\n")
    write(repo_root, os.fsdecode(b"na\xefve.py"), "new\n")

    outputs = [
        git_log(repo_root, "caf\\xe9.py"),
        git_show(repo_root, "HEAD", "caf\\xe9.py"),
        git_diff(repo_root, path="caf\\xe9.py"),
        git_diff(repo_root),
        git_blame(repo_root, "caf\\xe9.py"),
    ]

    log, show, diff, whole_diff, blame = outputs
    assert log.endswith("Ada: Add cafe")
    assert show.splitlines() == ["caf\\xe9.py at HEAD (1 lines)", "   1| cafe = 1"]
    assert "+cafe = 2" in diff
    assert whole_diff.endswith("untracked files: na\\xefve.py")
    assert blame.splitlines()[0] == "caf\\xe9.py (lines 1-1 of 1)"
    for out in outputs:
        out.encode("utf-8")  # no surrogate left for a tokenizer to choke on
