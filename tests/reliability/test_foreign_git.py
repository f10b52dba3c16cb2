"""A repository whose objects may be another's (a .git file or link pointing elsewhere,
objects/info/alternates) is refused by the git tools, with the real git folder named in
one line, and listed as a plain directory; git's own linked worktrees and submodules,
which link back, keep their git tools."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.registry import run_tool
from tools.repo_files import head_commit, list_files

from .support import git, make_repo

VICTIM = "VICTIM-PRIVATE"
GIT_TOOLS = [
    ("git_log", {}),
    ("git_show", {}),
    ("git_show", {"rev": "HEAD", "path": "notes.txt"}),
    ("git_diff", {}),
    ("git_blame", {"path": "app.py"}),
]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "victim", {"notes.txt": f"{VICTIM}\n", "app.py": "x = 1\n"})


def assert_refused(root: Path, git_dir_shown: str) -> None:
    for name, arguments in GIT_TOOLS:
        result = run_tool(root, name, arguments)
        assert result.startswith("error: git tools are off here: "), result
        assert git_dir_shown in result and "\n" not in result
        assert VICTIM not in result


def test_a_git_file_pointing_at_another_repository(tmp_path: Path, victim: Path) -> None:
    root = tmp_path / "download"
    root.mkdir()
    (root / "app.py").write_text("y = 2\n")
    (root / ".git").write_text(f"gitdir: {victim / '.git'}\n")

    assert_refused(root, f"is at {victim / '.git'}")
    # listed and read as a plain directory: what is on disk, nothing from the victim
    assert list_files(root) == ["app.py"]
    assert head_commit(root) is None


def test_a_git_link_pointing_at_another_repository(tmp_path: Path, victim: Path) -> None:
    root = tmp_path / "download"
    root.mkdir()
    (root / "app.py").write_text("y = 2\n")
    os.symlink(victim / ".git", root / ".git")
    assert_refused(root, f"is at {victim / '.git'}")


def test_a_git_file_pointing_at_another_repositorys_worktree(tmp_path: Path, victim: Path) -> None:
    git(victim, "worktree", "add", "-q", str(tmp_path / "victim-wt"))
    root = tmp_path / "download"
    root.mkdir()
    (root / "app.py").write_text("y = 2\n")
    (root / ".git").write_text(f"gitdir: {victim / '.git' / 'worktrees' / 'victim-wt'}\n")
    assert_refused(root, "not linked back to it")


def test_a_commondir_pointing_at_another_repository(tmp_path: Path, victim: Path) -> None:
    root = make_repo(tmp_path / "download", {"app.py": "y = 2\n"})
    (root / ".git" / "commondir").write_text(f"{victim / '.git'}\n")
    assert_refused(root, "not linked back to it")


@pytest.mark.parametrize("how", ["hostile", "clone --shared"])
def test_alternates_borrowing_another_repositorys_objects(
    tmp_path: Path, victim: Path, how: str
) -> None:
    if how == "hostile":
        root = make_repo(tmp_path / "download", {"app.py": "y = 2\n"})
        alternates = root / ".git" / "objects" / "info" / "alternates"
        alternates.write_text(f"{victim / '.git' / 'objects'}\n")
    else:
        root = tmp_path / "download"
        git(tmp_path, "clone", "-q", "--shared", str(victim), str(root))
    assert_refused(root, f"alternates borrows objects from {victim / '.git' / 'objects'}")
    assert "app.py" in list_files(root)


def test_an_objects_folder_linked_elsewhere(tmp_path: Path, victim: Path) -> None:
    root = tmp_path / "download"
    root.mkdir()
    git(root, "init", "-q")
    (root / ".git" / "objects").rename(tmp_path / "unused-objects")
    os.symlink(victim / ".git" / "objects", root / ".git" / "objects")
    assert_refused(root, "is a link to")


def test_a_linked_worktree_keeps_its_git_tools(tmp_path: Path, victim: Path) -> None:
    worktree = tmp_path / "feature"
    git(victim, "worktree", "add", "-q", str(worktree))
    assert run_tool(worktree, "git_log", {}).endswith("First")
    assert VICTIM in run_tool(worktree, "git_show", {"rev": "HEAD", "path": "notes.txt"})


def test_a_submodule_as_the_root_keeps_its_git_tools(tmp_path: Path, victim: Path) -> None:
    parent = make_repo(tmp_path / "parent", {"top.py": "z = 3\n"})
    git(parent, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(victim), "lib")
    assert run_tool(parent / "lib", "git_log", {}).endswith("First")
    assert "x = 1" in run_tool(parent / "lib", "git_blame", {"path": "app.py"})
