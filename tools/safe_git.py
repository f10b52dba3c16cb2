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
    """The git work tree holding a directory, with git run at its top."""

    top: Path
    git: SafeGit

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
    return WorkTree(top, git)


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
