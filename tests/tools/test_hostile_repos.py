"""A repository's own config must not make a read-only tool run a program or read a file
outside the root: fsmonitor hooks, filter drivers (its own or a submodule's), gpg.program,
blame.ignoreRevsFile, a core.worktree elsewhere."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tools.errors import ToolError
from tools.git_tools import git_blame, git_diff, git_log, git_show
from tools.registry import run_tool
from tools.repo_files import head_commit, list_files

from .support import commit, init_repo, write

# an identity of its own: a machine whose git has none configured can still commit
IDENTITY = {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com",
            "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.com"}  # fmt: skip


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True,
        env={**os.environ, **IDENTITY},
    ).stdout  # fmt: skip


def marker_script(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A program that leaves a marker file when run, and that marker; both outside the root."""
    marker = tmp_path / f"ran-{name}"
    script = tmp_path / f"{name}.sh"
    script.write_text(f"#!/bin/sh\ntouch '{marker}'\ncat\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, marker


@pytest.fixture
def repo_root(tmp_path: Path) -> Path:
    """One commit of app.py, then app.py changed in the work tree."""
    root = tmp_path / "repo"
    with init_repo(root) as repo:
        write(root, "app.py", "def main():\n    return 1\n")
        commit(repo, "Add app", "app.py")
    write(root, "app.py", "def main():\n    return 2\n")
    return root


@pytest.mark.parametrize("sub", ["", "pkg"], ids=["top", "subdirectory"])
def test_listing_runs_no_fsmonitor(repo_root: Path, tmp_path: Path, sub: str) -> None:
    marker = tmp_path / "pwned"
    git(repo_root, "config", "core.fsmonitor", f"touch '{marker}'; false")
    write(repo_root, "pkg/new.py", "def new():\n    pass\n")
    root = repo_root / sub

    assert list_files(root) == (["new.py"] if sub else ["app.py", "pkg/new.py"])
    assert "def new():" in run_tool(root, "grep", {"pattern": "def"})
    assert not marker.exists()


@pytest.mark.parametrize("name", ["evil", "Dotted.Name"])
@pytest.mark.parametrize("setting", ["clean", "process"])
@pytest.mark.parametrize("read", ["git_diff", "git_blame"])
def test_diff_and_blame_run_no_filter_driver(
    repo_root: Path, tmp_path: Path, read: str, setting: str, name: str
) -> None:
    script, marker = marker_script(tmp_path, "filter")
    write(repo_root, ".gitattributes", f"*.py filter={name}\n")
    git(repo_root, "config", f"filter.{name}.{setting}", str(script))
    git(repo_root, "config", f"filter.{name}.required", "true")  # a failed filter is fatal

    out = git_diff(repo_root) if read == "git_diff" else git_blame(repo_root, "app.py")

    assert "return 2" in out
    assert not marker.exists()


def test_a_filter_git_cannot_turn_off_fails_the_git_tools(repo_root: Path, tmp_path: Path) -> None:
    script, marker = marker_script(tmp_path, "filter")
    write(repo_root, ".gitattributes", "*.py filter=a=b\n")
    # -c splits at the first "=", so no -c option can name this driver
    with (repo_root / ".git" / "config").open("a") as config:
        config.write(f'[filter "a=b"]\n\tclean = {script}\n')

    with pytest.raises(ToolError, match="filter git cannot turn off"):
        git_diff(repo_root)
    assert list_files(repo_root) == [".gitattributes", "app.py"]  # read as a plain directory
    assert not marker.exists()


def signed_commit(root: Path) -> None:
    """A commit whose gpgsig header makes `git log --show-signature` run gpg.program."""
    tree = git(root, "write-tree").strip()
    parent = git(root, "rev-parse", "HEAD").strip()
    body = (
        f"tree {tree}\nparent {parent}\n"
        "author Ada <ada@example.com> 1709294400 +0000\n"
        "committer Ada <ada@example.com> 1709294400 +0000\n"
        "gpgsig -----BEGIN PGP SIGNATURE-----\n \n abc\n -----END PGP SIGNATURE-----\n"
        "\nSigned\n"
    )
    made = subprocess.run(
        ["git", "-C", str(root), "hash-object", "-t", "commit", "-w", "--stdin"],
        input=body,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    git(root, "update-ref", "HEAD", made)


@pytest.mark.parametrize("read", ["git_log", "git_show"])
def test_log_and_show_run_no_gpg_program(repo_root: Path, tmp_path: Path, read: str) -> None:
    script, marker = marker_script(tmp_path, "gpg")
    signed_commit(repo_root)
    git(repo_root, "config", "log.showSignature", "true")
    git(repo_root, "config", "gpg.program", str(script))

    out = git_log(repo_root) if read == "git_log" else git_show(repo_root)

    assert "Signed" in out
    assert not marker.exists()


def test_blame_reads_no_ignore_revs_file_outside_the_repository(
    repo_root: Path, tmp_path: Path
) -> None:
    secret = write(tmp_path, "secret.txt", "TOP SECRET\n")
    git(repo_root, "config", "blame.ignoreRevsFile", str(secret))

    with pytest.raises(ToolError, match="blame.ignoreRevsFile names a file outside") as caught:
        git_blame(repo_root, "app.py")
    assert "TOP SECRET" not in str(caught.value)

    # one inside the repository is the repository's own business
    write(repo_root, ".git-blame-ignore-revs", "# nothing to ignore\n")
    git(repo_root, "config", "--replace-all", "blame.ignoreRevsFile", ".git-blame-ignore-revs")
    assert "2|     return 2" in git_blame(repo_root, "app.py")


def test_blame_in_a_sub_folder_reads_no_ignore_revs_file_outside_it(repo_root: Path) -> None:
    write(repo_root, "pkg/mod.py", "x = 1\n")
    write(repo_root, "notes.txt", "OUTSIDE THE SUB-FOLDER\n")
    git(repo_root, "add", "-A")
    git(repo_root, "commit", "-qm", "pkg")
    git(repo_root, "config", "blame.ignoreRevsFile", "notes.txt")
    sub = repo_root / "pkg"

    with pytest.raises(ToolError, match="outside the root") as caught:
        git_blame(sub, "mod.py")
    assert "OUTSIDE" not in str(caught.value)

    write(sub, "ignore-revs", "# nothing to ignore\n")
    git(repo_root, "config", "--replace-all", "blame.ignoreRevsFile", "pkg/ignore-revs")
    assert "1| x = 1" in git_blame(sub, "mod.py")

    # the usual top-level file of commit names: nothing of it can show, so blame runs
    write(repo_root, ".git-blame-ignore-revs", f"# formatting\n\n{'0' * 40}\n")
    git(repo_root, "config", "--replace-all", "blame.ignoreRevsFile", ".git-blame-ignore-revs")
    assert "1| x = 1" in git_blame(sub, "mod.py")


def test_a_work_tree_configured_elsewhere_is_not_read(repo_root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside, "secret.py", "TOKEN = 'secret'\n")
    git(repo_root, "config", "core.worktree", str(outside))

    # the files the user named are read as a plain directory; git's work tree is not theirs
    assert list_files(repo_root) == ["app.py"]
    assert head_commit(repo_root) is None
    with pytest.raises(ToolError, match="not a git repository"):
        git_diff(repo_root)


def test_diff_runs_nothing_from_a_submodules_config(repo_root: Path, tmp_path: Path) -> None:
    script, marker = marker_script(tmp_path, "filter")
    source = tmp_path / "source"
    with init_repo(source) as repo:
        write(source, ".gitattributes", "*.py filter=evil\n")
        write(source, "lib.py", "x = 1\n")
        commit(repo, "Add lib", ".gitattributes", "lib.py")
    git(repo_root, "-c", "protocol.file.allow=always", "submodule", "add", str(source), "sub")
    git(repo_root / "sub", "config", "filter.evil.clean", str(script))
    write(repo_root, "sub/lib.py", "x = 2\n")  # a dirty submodule: git would run status there

    assert "+    return 2" in git_diff(repo_root)
    assert not marker.exists()
