"""Run git on a repository that may be hostile: read-only, and running none of its programs.

A repository's own config (.git/config, and what it includes) can name programs that git
runs during commands as harmless as `git ls-files` or `git diff`. Every git command the
tools run goes through SafeGit, which turns those programs off.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tools.errors import ToolError
from tools.names import no_surrogates

# Config that would run a program from the repository's config, turned off:
# core.fsmonitor runs a hook whenever git reads the index (ls-files, diff, blame...);
# diff.external runs an external diff driver; log.showSignature runs gpg.program (any
# command) on signed commits in `git log` and `git show`. -c wins over every config file.
SAFE_CONFIG = (
    "-c",
    "core.fsmonitor=false",
    "-c",
    "diff.external=",
    "-c",
    "log.showSignature=false",
)
# For commands that show diffs: no diff.<driver>.command, no textconv filter, and no look
# into submodules, which would run git there with the submodule's own config.
SAFE_DIFF = ("--no-ext-diff", "--no-textconv", "--submodule=short", "--ignore-submodules=dirty")
# GIT_OPTIONAL_LOCKS keeps `git diff` from refreshing .git/index: these tools write nothing.
# No transport is allowed, so nothing is fetched: in a partial clone a missing object would
# make git fetch it, and a remote's url or uploadpack can be a command.
SAFE_ENV = {
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ALLOW_PROTOCOL": "",
    "GIT_NO_LAZY_FETCH": "1",
}
# A filter driver's clean command runs when git reads a work tree file (diff, blame):
# each driver the config defines gets these values, which make it a no-op.
_FILTER_OFF = ("clean=", "smudge=", "process=", "required=false")
# Config the user wrote, not the repository: `git config --show-scope` names.
_TRUSTED_SCOPES = frozenset({b"system", b"global", b"command"})


class GitFailed(ToolError):
    """git exited with an error; the message is git's own first line."""


class UnsafeRepository(GitFailed):
    """The repository's config names a program that SafeGit cannot turn off."""


class SafeGit:
    """git run in one directory, with the repository's programs turned off."""

    def __init__(self, cwd: str | os.PathLike[str]):
        self.cwd = Path(cwd)
        self._filters: tuple[str, ...] | None = None

    def run(self, *args: str, cwd: Path | None = None) -> str:
        return self.run_bytes(*args, cwd=cwd).decode("utf-8", errors="replace")

    def run_bytes(self, *args: str, cwd: Path | None = None) -> bytes:
        """git's output; cwd, a directory of the same work tree, to run somewhere else."""
        if self._filters is None:
            self._filters = self._filters_off()
        return self._execute(*self._filters, *args, cwd=cwd)

    def ok(self, *args: str) -> bool:
        """Whether the command exits with status 0 (check-ignore -q, rev-parse --verify)."""
        try:
            self.run_bytes(*args)
        except GitFailed:
            return False
        return True

    def _execute(self, *args: str, cwd: Path | None = None) -> bytes:
        try:
            import git  # late: GitPython refuses to import without a git binary
        except ImportError as exc:
            raise GitFailed("git tools need GitPython and a git executable") from exc
        command = ["git", *SAFE_CONFIG, *args]
        try:
            return git.Git(str(cwd or self.cwd)).execute(
                command, stdout_as_string=False, env=SAFE_ENV
            )
        except git.exc.GitError as exc:
            raise GitFailed(git_message(exc)) from None

    def _filters_off(self) -> tuple[str, ...]:
        """-c options that turn off every filter driver the repository's config defines."""
        try:
            out = self._execute(
                "config", "-z", "--show-scope", "--name-only", "--get-regexp", r"^filter\."
            )
        except GitFailed:
            # status 1: no filter configured; a config git cannot read fails the command too
            return ()
        items = out.split(b"\0")
        names: set[str] = set()
        for scope, key in zip(items[0::2], items[1::2], strict=False):
            # the user's own drivers (git-lfs in ~/.gitconfig) stay; the repository's go,
            # with the files its config includes, which git reports as its scope too
            if scope not in _TRUSTED_SCOPES:
                names.add(os.fsdecode(key)[len("filter.") :].rpartition(".")[0])
        names.discard("")
        options: list[str] = []
        for name in sorted(names):
            if "=" in name:
                # -c splits at the first "=", so no option can name this driver
                raise UnsafeRepository(
                    f"the repository configures a filter git cannot turn off: {name!r}"
                )
            for setting in _FILTER_OFF:
                options += ["-c", f"filter.{name}.{setting}"]
        return tuple(options)


@dataclass(frozen=True)
class WorkTree:
    """The git work tree holding a directory, with git run at its top. `foreign` is the
    one-line reason when its objects may come from another repository (see foreign_git_data):
    the git tools then refuse it, and listings read it as a plain directory."""

    top: Path
    git: SafeGit
    foreign: str | None = None

    def ignores(self, base: Path) -> bool:
        """Whether the repository ignores the directory base (vendored code, a venv)."""
        if base == self.top:
            return False
        # exit status 0 means ignored, 1 not ignored; the slash marks a directory
        return self.git.ok("check-ignore", "-q", "--", base.relative_to(self.top).as_posix() + "/")


def find_work_tree(base: Path) -> WorkTree | None:
    """The work tree holding base, as git itself sees it, or None: no git, not in a work
    tree, a bare repository, a repository git refuses (owned by someone else), or one whose
    core.worktree lies elsewhere. UnsafeRepository where git may not run there at all."""
    git = SafeGit(base)
    try:
        out = git.run_bytes("rev-parse", "--show-toplevel")
    except UnsafeRepository:
        raise
    except GitFailed:
        return None
    top = Path(os.fsdecode(out[:-1] if out.endswith(b"\n") else out)).resolve()
    if not base.is_relative_to(top):
        return None  # core.worktree points away from the files the user named
    git.cwd = top
    return WorkTree(top, git, foreign_git_data(git, top))


def foreign_git_data(git: SafeGit, top: Path) -> str | None:
    """Why the objects git reads for the work tree at top may be another repository's, or
    None. A `.git` file or link can point at any repository on the disk, and
    objects/info/alternates can borrow any repository's objects: the tools would then show
    files from outside the root. A git folder outside top is accepted only when it links back
    to top, which only git (or the owner of that repository) writes: a linked worktree's
    `worktrees/<name>/gitdir`, or a submodule's core.worktree."""
    try:
        out = git.run_bytes("rev-parse", "--absolute-git-dir", "--git-common-dir")
        git_dir_line, common_line = os.fsdecode(out).splitlines()[:2]
    except (GitFailed, ValueError):
        return f"git tools are off here: git does not name the git folder of {top}"
    git_dir = Path(git_dir_line).resolve()
    common = (top / common_line).resolve()  # relative to where git ran, the top
    inside = git_dir.is_relative_to(top) and common.is_relative_to(top)
    if not inside and not _links_back(git, top, git_dir, common):
        return (
            f"git tools are off here: the git data of {top} is at {git_dir}, outside it and "
            "not linked back to it (a .git file or link pointing elsewhere), so another "
            "repository's files could reach the model"
        )
    objects = common / "objects"
    if objects.resolve() != objects:
        return (
            f"git tools are off here: {objects} is a link to {objects.resolve()}, so another "
            "repository's files could reach the model"
        )
    borrowed = _alternates(objects / "info" / "alternates")
    if borrowed:
        return (
            f"git tools are off here: {objects}/info/alternates borrows objects from "
            f"{borrowed[0]}, so another repository's files could reach the model"
        )
    return None


def _links_back(git: SafeGit, top: Path, git_dir: Path, common: Path) -> bool:
    try:
        if git_dir.parent == common / "worktrees":  # `git worktree add`
            back = (git_dir / "gitdir").read_text(encoding="utf-8").strip()
            return (git_dir / back).resolve() == (top / ".git").resolve()
        if git_dir == common:  # a submodule's, or `git init --separate-git-dir`
            named = git.run("config", "--local", "--get", "core.worktree").strip()
            return bool(named) and (git_dir / named).resolve() == top
    except (OSError, UnicodeDecodeError, ValueError, GitFailed):
        pass
    return False


def _alternates(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []  # none: the usual case
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def git_message(exc: Exception) -> str:
    """Git's own one-line complaint, without GitPython's wrapping."""
    stderr = str(getattr(exc, "stderr", "") or "")
    match = re.search(r"stderr: '(.*)'\s*$", stderr, re.DOTALL)
    text = match.group(1) if match else stderr
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return f"git failed: {exc}"
    # the caller adds its own "error: " in front; a name git quotes may hold undecodable bytes
    return no_surrogates(re.sub(r"^(fatal|error): ", "", lines[0]))
