from __future__ import annotations

import os
import subprocess
from pathlib import Path

import git
import pytest

from tests.tools.support import write
from tools.errors import (
    BinaryFileError,
    FileTooLargeError,
    PathEscapeError,
    RootError,
    UnreadableFileError,
)
from tools.repo_files import (
    confine,
    head_commit,
    is_text_file,
    list_files,
    read_text,
    resolve_root,
)

AUTHOR = git.Actor("Test", "test@example.com")


def commit(repo: git.Repo, *paths: str) -> None:
    repo.index.add(list(paths))
    repo.index.commit("add files", author=AUTHOR, committer=AUTHOR)


@pytest.fixture
def repo_root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git.Repo.init(root).close()
    return root


# --- resolve_root ---


def test_resolve_root_gives_an_absolute_directory(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_root("sub") == (tmp_path / "sub").resolve()


def test_resolve_root_refuses_a_missing_path(tmp_path: Path) -> None:
    with pytest.raises(RootError, match="repository path does not exist"):
        resolve_root(tmp_path / "nope")


def test_resolve_root_refuses_a_file(tmp_path: Path) -> None:
    with pytest.raises(RootError, match="not a directory"):
        resolve_root(write(tmp_path, "file.txt"))


# --- list_files in a git work tree ---


def test_list_files_respects_gitignore_and_info_exclude(repo_root: Path) -> None:
    with git.Repo(repo_root) as repo:
        write(repo_root, ".gitignore", "*.log\nbuild/\n")
        write(repo_root, "app.py")
        commit(repo, ".gitignore", "app.py")
    write(repo_root, ".git/info/exclude", "secret.txt\n")
    write(repo_root, "debug.log")
    write(repo_root, "build/out.py")
    write(repo_root, "secret.txt")
    write(repo_root, "untracked.py")
    write(repo_root, "pkg/mod.py")

    assert list_files(repo_root) == [".gitignore", "app.py", "pkg/mod.py", "untracked.py"]


def test_list_files_works_in_a_repo_with_no_commits(repo_root: Path) -> None:
    write(repo_root, ".gitignore", "ignored/\n")
    write(repo_root, "main.py")
    write(repo_root, "ignored/junk.py")

    assert list_files(repo_root) == [".gitignore", "main.py"]


def test_list_files_never_lists_git_internals(repo_root: Path) -> None:
    with git.Repo(repo_root) as repo:
        write(repo_root, "a.py")
        commit(repo, "a.py")

    assert list_files(repo_root) == ["a.py"]


def test_list_files_limits_git_listing_to_a_subdirectory(repo_root: Path) -> None:
    write(repo_root, "top.py")
    write(repo_root, "pkg/inner.py")
    write(repo_root, "pkg/deep/leaf.py")

    assert list_files(repo_root / "pkg") == ["deep/leaf.py", "inner.py"]


def test_list_files_reads_a_directory_its_repo_ignores(repo_root: Path) -> None:
    write(repo_root, ".gitignore", "vendor/\n")
    write(repo_root, "vendor/lib/.gitignore", "*.o\n")
    write(repo_root, "vendor/lib/code.c")
    write(repo_root, "vendor/lib/code.o")

    assert list_files(repo_root) == [".gitignore"]
    assert list_files(repo_root / "vendor/lib") == [".gitignore", "code.c"]
    with git.Repo(repo_root) as repo:
        commit(repo, ".gitignore")
    assert head_commit(repo_root / "vendor/lib") is None


def test_list_files_skips_tracked_files_deleted_from_disk(repo_root: Path) -> None:
    with git.Repo(repo_root) as repo:
        write(repo_root, "kept.py")
        write(repo_root, "gone.py")
        commit(repo, "kept.py", "gone.py")
    (repo_root / "gone.py").unlink()

    assert list_files(repo_root) == ["kept.py"]


def test_list_files_skips_symlinks_leaving_the_root(tmp_path: Path, repo_root: Path) -> None:
    outside = write(tmp_path, "outside.txt", "secret\n")
    write(repo_root, "real.py")
    os.symlink(outside, repo_root / "leak.txt")
    os.symlink("real.py", repo_root / "alias.py")

    assert list_files(repo_root) == ["alias.py", "real.py"]


# --- list_files in a plain directory ---


def test_list_files_walks_a_plain_directory_honouring_gitignore(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    write(root, ".gitignore", "*.log\nbuild/\n/only_top.txt\n")
    write(root, "main.py")
    write(root, "debug.log")
    write(root, "build/out.py")
    write(root, "only_top.txt")
    write(root, "sub/only_top.txt")
    write(root, "sub/.gitignore", "*.tmp\n!keep.log\n")
    write(root, "sub/x.tmp")
    write(root, "sub/keep.log")
    write(root, ".venv/lib/site.py")
    write(root, "node_modules/pkg/index.js")
    write(root, "pkg/__pycache__/mod.cpython-311.pyc", b"\0\1")
    write(root, ".git/config", "not a real repository\n")

    assert list_files(root) == [
        ".gitignore",
        "main.py",
        "sub/.gitignore",
        "sub/keep.log",
        "sub/only_top.txt",
    ]


@pytest.mark.parametrize("in_git", [True, False], ids=["git", "plain"])
def test_list_files_leaves_out_a_virtual_environment_whatever_its_name(
    tmp_path: Path, in_git: bool
) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    if in_git:
        git.Repo.init(root).close()  # the venv is untracked and not ignored: git lists it
    write(root, "app.py")
    for venv in ("venv", "tools/env"):
        write(root, f"{venv}/pyvenv.cfg", "home = /usr/bin\n")
        write(root, f"{venv}/lib/python3.11/site-packages/pkg/__init__.py")
        write(root, f"{venv}/bin/activate")
    write(root, "venvs.md")  # a name that only starts like one
    write(root, "env/settings.py")  # a folder named env without pyvenv.cfg is the project's
    assert list_files(root) == ["app.py", "env/settings.py", "venvs.md"]


def test_list_files_in_a_plain_directory_skips_symlinks_leaving_it(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    write(root, "real.py")
    outside = write(tmp_path, "outside.txt")
    os.symlink(outside, root / "leak.txt")
    os.symlink(tmp_path, root / "up")

    assert list_files(root) == ["real.py"]


# --- confine ---


def test_confine_allows_paths_inside_the_root(tmp_path: Path) -> None:
    target = write(tmp_path, "pkg/mod.py")
    assert confine(tmp_path, "pkg/mod.py") == target.resolve()
    assert confine(tmp_path, "pkg/../pkg/mod.py") == target.resolve()
    assert confine(tmp_path, target.resolve()) == target.resolve()


def test_confine_refuses_dotdot_escapes(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    with pytest.raises(PathEscapeError, match=r"\.\./secret"):
        confine(root, "../secret")
    with pytest.raises(PathEscapeError):
        confine(root, "pkg/../../secret")


def test_confine_refuses_absolute_paths_outside(tmp_path: Path) -> None:
    with pytest.raises(PathEscapeError, match="/etc/passwd"):
        confine(tmp_path, "/etc/passwd")


def test_confine_refuses_a_symlink_pointing_out(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    outside = write(tmp_path, "outside.txt")
    os.symlink(outside, root / "link.txt")
    with pytest.raises(PathEscapeError, match="link.txt"):
        confine(root, "link.txt")


def test_confine_allows_a_symlink_inside_the_root(tmp_path: Path) -> None:
    target = write(tmp_path, "pkg/real.py")
    os.symlink("pkg/real.py", tmp_path / "alias.py")
    assert confine(tmp_path, "alias.py") == target.resolve()


# --- read_text ---


def test_read_text_returns_text_with_lf_line_ends(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "\ufeffone\r\ntwo\n".encode())
    assert read_text(tmp_path, "a.txt") == "one\ntwo\n"


def test_read_text_refuses_a_binary_file(tmp_path: Path) -> None:
    write(tmp_path, "logo.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    with pytest.raises(BinaryFileError, match="not a text file: logo.png"):
        read_text(tmp_path, "logo.png")


def test_read_text_refuses_invalid_utf8(tmp_path: Path) -> None:
    write(tmp_path, "latin1.txt", "café\n".encode("latin-1"))
    with pytest.raises(BinaryFileError, match="not a text file: latin1.txt"):
        read_text(tmp_path, "latin1.txt")


def test_read_text_refuses_invalid_utf8_past_the_sniffed_head(tmp_path: Path) -> None:
    write(tmp_path, "late.txt", b"a" * 10_000 + b"\xff")
    with pytest.raises(BinaryFileError):
        read_text(tmp_path, "late.txt")


def test_read_text_refuses_a_file_over_the_limit(tmp_path: Path) -> None:
    write(tmp_path, "big.txt", "x" * 2_000)
    with pytest.raises(FileTooLargeError, match=r"big.txt \(2,000 bytes, limit 1,000\)"):
        read_text(tmp_path, "big.txt", max_bytes=1_000)
    assert read_text(tmp_path, "big.txt", max_bytes=2_000) == "x" * 2_000


def test_read_text_is_confined(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    write(tmp_path, "secret.txt")
    with pytest.raises(PathEscapeError):
        read_text(root, "../secret.txt")


def test_read_text_reports_missing_files_and_directories(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    with pytest.raises(UnreadableFileError, match="cannot read nope.txt"):
        read_text(tmp_path, "nope.txt")
    with pytest.raises(UnreadableFileError, match="not a regular file: pkg"):
        read_text(tmp_path, "pkg")


def test_is_text_file(tmp_path: Path) -> None:
    assert is_text_file(write(tmp_path, "a.py", "print('hi')\n"))
    # a multi-byte character cut by the 8 KiB sniff is still text
    assert is_text_file(write(tmp_path, "cut.txt", "a" * 8191 + "é"))
    assert not is_text_file(write(tmp_path, "nul.bin", b"ab\0cd"))
    assert not is_text_file(write(tmp_path, "bad.txt", b"\xff\xfe\xfa"))
    assert not is_text_file(tmp_path / "missing")


# --- head_commit ---


def test_head_commit(tmp_path: Path, repo_root: Path) -> None:
    assert head_commit(tmp_path) is None
    assert head_commit(repo_root) is None  # no commits yet
    with git.Repo(repo_root) as repo:
        write(repo_root, "a.py")
        commit(repo, "a.py")
        assert head_commit(repo_root) == repo.head.commit.hexsha


# --- names that are not UTF-8, or not printable ---

# A Latin-1 "é": os.fsdecode keeps it as the surrogate "\udce9", which no tokenizer takes.
LATIN1_NAME = os.fsdecode(b"caf\xe9.py")


def git_cli(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@pytest.mark.parametrize("where", ["tracked", "untracked", "plain directory"])
def test_a_name_that_is_not_utf8_is_listed_printable_and_read_back(
    tmp_path: Path, where: str
) -> None:
    root = tmp_path / "repo"
    write(root, LATIN1_NAME, "caf = 1\n")
    write(root, "ok.py")
    if where != "plain directory":
        git_cli(tmp_path, "init", "-q", str(root))
    if where == "tracked":
        git_cli(root, "add", "-A")

    listed = list_files(root)

    assert listed == ["caf\\xe9.py", "ok.py"]
    assert all(is_utf8(path) for path in listed)
    assert read_text(root, "caf\\xe9.py") == "caf = 1\n"
    # git's own quoting of the name, "caf\351.py", names it too
    assert read_text(root, "caf\\351.py") == "caf = 1\n"


def test_unusual_names_are_shown_unambiguously_and_read_back(tmp_path: Path) -> None:
    names = {
        "tab\there.py": "tab",
        "back\\slash.py": "backslash",
        "notes\\x41.txt": "literal backslash-x41",
        "notesA.txt": "A",
        "line\u2028sep.md": "line separator",
    }
    for name, content in names.items():
        write(tmp_path, name, content + "\n")

    listed = list_files(tmp_path)

    assert listed == [
        "back\\\\slash.py",
        "line\\u2028sep.md",
        "notesA.txt",
        "notes\\\\x41.txt",
        "tab\\x09here.py",
    ]
    assert sorted(read_text(tmp_path, path).strip() for path in listed) == sorted(names.values())
    # the name as it is on disk still reads where the escapes name no file
    assert read_text(tmp_path, "back\\slash.py") == "backslash\n"
    assert read_text(tmp_path, "tab\\there.py") == "tab\n"  # as git quotes a tab
    # ...but the escaped form wins: \x41 is "A"
    assert read_text(tmp_path, "notes\\x41.txt") == "A\n"


def test_messages_about_a_name_that_is_not_utf8_are_printable(tmp_path: Path) -> None:
    write(tmp_path, LATIN1_NAME, b"\0binary")
    with pytest.raises(BinaryFileError) as caught:
        read_text(tmp_path, LATIN1_NAME)
    assert str(caught.value) == "not a text file: caf\\xe9.py"
    with pytest.raises(UnreadableFileError, match=r"cannot read nope\\xff: "):
        read_text(tmp_path, os.fsdecode(b"nope\xff"))


# --- .gitignore patterns git cannot use ---


@pytest.mark.parametrize("bad", ["[z-a]", "\\", "!", "a[z-a]b"])
def test_a_plain_directory_skips_gitignore_lines_it_cannot_use(tmp_path: Path, bad: str) -> None:
    root = tmp_path / "plain"
    write(root, ".gitignore", f"*.log\n{bad}\nbuild/\n")
    write(root, "main.py")
    write(root, "debug.log")
    write(root, "build/out.py")
    write(root, "ab")

    # the lines around the bad one still apply, as in git
    assert list_files(root) == [".gitignore", "ab", "main.py"]


@pytest.mark.parametrize("path", ["/proc", "/proc/self", "/sys", "/dev"])
def test_kernel_file_systems_are_not_repositories(path):
    with pytest.raises(RootError, match="kernel file system"):
        resolve_root(path)


@pytest.mark.parametrize("path", ["~nosuchuser_agentctx/x", "/tmp/" + "a" * 300])
def test_paths_the_os_cannot_take_are_root_errors(path):
    with pytest.raises(RootError, match="cannot use"):
        resolve_root(path)


def test_a_walk_stops_after_max_walked_files(tmp_path, monkeypatch):
    from tools import repo_files

    monkeypatch.setattr(repo_files, "MAX_WALKED", 5)
    for i in range(12):
        (tmp_path / f"f{i:02d}.txt").write_text("x\n")
    assert len(list_files(tmp_path)) == 5


def _agentctx_ignore_tree(root: Path) -> None:
    write(root, ".agentctxignore", "generated/\n*.snap\n!keep.snap\n")
    write(root, "src/app.py", "print('app')\n")
    write(root, "generated/api.py", "x = 1\n")
    write(root, "src/generated/deep.py", "x = 2\n")  # "generated/" matches at any depth
    write(root, "tests/a.snap", "snapshot\n")
    write(root, "tests/keep.snap", "kept\n")
    write(root, "docs/.agentctxignore", "drafts/\n/local.md\n")
    write(root, "docs/drafts/wip.md", "wip\n")
    write(root, "docs/local.md", "local\n")
    write(root, "docs/sub/local.md", "not anchored here\n")


AGENTCTX_KEPT = [
    ".agentctxignore", "docs/.agentctxignore", "docs/sub/local.md", "src/app.py",
    "tests/keep.snap",
]  # fmt: skip


def test_agentctxignore_leaves_files_out_of_a_git_listing(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _agentctx_ignore_tree(root)
    with git.Repo.init(root) as repo:  # tracked: git alone would list every file
        repo.git.add("-A")
        repo.index.commit("all", author=AUTHOR, committer=AUTHOR)
    assert list_files(root) == AGENTCTX_KEPT


def test_agentctxignore_leaves_files_out_of_a_plain_directory(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    _agentctx_ignore_tree(root)
    assert list_files(root) == AGENTCTX_KEPT
