"""Read-only views of a repository's git history: log, show, diff and blame."""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path

from tools.errors import FileTooLargeError, ToolError
from tools.names import printable, show_path
from tools.read_file import check_range, number_lines, split_lines
from tools.repo_files import confine, read_text, resolve_root
from tools.safe_git import SAFE_DIFF, GitFailed, find_work_tree
from tools.secrets import is_secret

NO_COMMITS = "the repository has no commits yet"
# The same limit read_text puts on files in the work tree.
MAX_FILE_BYTES = 1_000_000
# No revision a model writes is longer (HEAD~3, a sha, a branch, HEAD@{2.days.ago}).
MAX_REV_CHARS = 256
# A commit that changes more secret-looking files than this is refused rather than shown
# with each left out: every one is a pathspec argument.
MAX_EXCLUDED = 500


def git_log(root: str | os.PathLike[str], path: str | None = None, max_count: int = 20) -> str:
    if max_count < 1:
        raise ToolError(f"max_count must be 1 or more, got {max_count}")
    with _Repo(root) as repo:
        repo.require_commits()
        spec = repo.pathspec(path)
        # one extra commit tells whether there are more than were asked for
        args = ["log", f"--max-count={max_count + 1}", "--date=short"]
        args.append("--format=%h %ad %an: %s")
        if path is not None and repo.top == repo.base and repo.confined(path).is_file():
            # a file's history goes on past its renames; not below a sub-folder root, where
            # it would go on into files outside the root
            args.append("--follow")
        lines = split_lines(repo.run(*args, "--", *spec))
    if not lines:
        return f"no commits touch {printable(path) if path else 'this directory'}"
    if len(lines) > max_count:
        lines = [*lines[:max_count], f"... more commits; raise max_count (now {max_count})"]
    return "\n".join(lines)


def git_show(
    root: str | os.PathLike[str],
    rev: str = "HEAD",
    path: str | None = None,
    max_chars: int = 20000,
) -> str:
    """rev may carry a path, `rev:path`: relative to the root, like path (`HEAD:` is the
    root's own tree). Whatever it names must lie inside the root and be no secret."""
    with _Repo(root) as repo:
        repo.require_commits()
        commit_rev, rev_path = split_rev(rev)
        if rev_path is not None and path is not None:
            raise ToolError(f"the revision {printable(rev)} names a path: give path once")
        sha = repo.commit(commit_rev)
        path = rev_path if rev_path is not None else path
        if path is None:
            spec = [*repo.pathspec(None), *repo.secret_excludes(sha)]
            text = repo.run("show", *SAFE_DIFF, "--patch-with-stat", sha, "--", *spec)
            if not text:  # git shows nothing of a commit the pathspec leaves out
                return f"commit {sha[:10]} ({printable(rev)}) changes no file under the root"
            return _cap(text, max_chars)
        rel = repo.relative(path or ".")  # confined: outside the root or a secret is refused
        obj = f"{sha}:{'' if rel == '.' else rel}"
        shown = printable(path or ".")
        label = f"{shown} at {printable(commit_rev)}"
        try:
            kind = repo.run("cat-file", "-t", obj).strip()
        except GitFailed:
            on_disk = repo.confined(path or ".").exists()
            where = "exists on disk, but not" if on_disk else "does not exist"
            raise ToolError(f"path '{shown}' {where} in '{printable(commit_rev)}'") from None
        if kind == "tree":
            return _cap(_tree_listing(repo, obj, rel, label), max_chars)
        if kind != "blob":  # a submodule's commit
            raise ToolError(f"{label} is a {kind}, not a file")
        size = int(repo.run("cat-file", "-s", obj))
        if size > MAX_FILE_BYTES:  # refused before git loads it, as read_text does on disk
            raise FileTooLargeError(label, size, MAX_FILE_BYTES)
        data = repo.run_bytes("cat-file", "blob", obj)
    try:
        if b"\0" in data:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"not a text file: {label}") from None
    lines = split_lines(text.replace("\r\n", "\n"))
    body = "\n".join(number_lines(lines, 1))
    return _cap(f"{label} ({len(lines)} lines)\n{body}", max_chars)


def git_diff(
    root: str | os.PathLike[str],
    rev_a: str | None = None,
    rev_b: str | None = None,
    path: str | None = None,
    max_chars: int = 20000,
) -> str:
    if rev_a is None and rev_b is not None:
        raise ToolError("rev_b needs rev_a: give both revisions, or only rev_a")
    with _Repo(root) as repo:
        repo.require_commits()
        revs = []
        for rev in [rev_a or "HEAD"] + ([rev_b] if rev_b else []):
            if split_rev(rev)[1] is not None:
                # two blobs would be diffed whatever the pathspec says
                raise ToolError(
                    f"git_diff compares commits; give the file as path: {printable(rev)}"
                )
            revs.append(repo.commit(rev))
        spec = repo.pathspec(path)
        spec += repo.secret_excludes(*revs, paths=spec)
        text = repo.run("diff", *SAFE_DIFF, "--patch-with-stat", *revs, "--", *spec)
        untracked: list[str] = []
        if rev_b is None:
            # git diff never shows new files it does not track; the model should know of them
            listed = repo.run_bytes("ls-files", "-z", "--others", "--exclude-standard", "--", *spec)
            names = [os.fsdecode(name) for name in listed.split(b"\0") if name]
            untracked = [show_path(n) for n in names if not is_secret(repo.below_root(n))]
    if untracked:
        text += ("\n\n" if text else "") + "untracked files: " + ", ".join(untracked)
    return _cap(text, max_chars) if text else "no differences"


def git_blame(
    root: str | os.PathLike[str],
    path: str,
    start: int = 1,
    end: int | None = None,
    max_lines: int = 400,
) -> str:
    with _Repo(root) as repo:
        repo.require_commits()
        # reading the file first refuses binary and huge files and validates the range
        total = len(split_lines(read_text(repo.base, path)))
        last = min(check_range(path, total, start, end), start + max(max_lines, 1) - 1)
        spec = repo.pathspec(path)
        if not repo.run("ls-files", "--", *spec):
            raise ToolError(f"not tracked by git: {printable(path)}")
        repo.check_ignore_revs_files()
        # blame takes a plain path, not a pathspec with magic
        rel = repo.relative(path)
        porcelain = repo.run(
            "blame", "--line-porcelain", "--no-textconv", f"-L{start},{last}", "--", rel
        )
    rows = _parse_blame(porcelain)
    width = max((len(author) for _, author, _, _ in rows), default=0)
    number_width = max(4, len(str(last)))
    out = [f"{printable(path)} (lines {start}-{last} of {total})"]
    for number, (sha, author, date, text) in enumerate(rows, start):
        out.append(f"{sha} {author:<{width}} {date} {number:>{number_width}}| {text}")
    if last < (total if end is None else min(end, total)):
        out.append(f"... truncated at {max_lines} lines; read on with start={last + 1}")
    return "\n".join(out)


class _Repo:
    """The work tree holding the root the user named, which may be a subdirectory of it."""

    def __init__(self, root: str | os.PathLike[str]):
        self.base = resolve_root(root)
        try:
            import git  # noqa: F401  late: GitPython refuses to import without a git binary
        except ImportError as exc:
            raise ToolError("git tools need GitPython and a git executable") from exc
        tree = find_work_tree(self.base)
        if tree is None or tree.ignores(self.base):
            # an ignored directory's files are not the enclosing repository's history
            raise ToolError(f"not a git repository: {printable(os.fspath(root))}")
        if tree.foreign:  # a .git file or alternates lead to another repository's objects
            raise ToolError(tree.foreign)
        self.top = tree.top
        self.git = tree.git  # runs at top, with the repository's programs turned off

    def __enter__(self) -> _Repo:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def require_commits(self) -> None:
        if not self.git.ok("rev-parse", "--verify", "--quiet", "HEAD^{commit}"):
            raise ToolError(NO_COMMITS)

    def commit(self, rev: str) -> str:
        """The sha of the commit rev names. Trees and blobs are refused: `HEAD^{tree}` or a
        blob's sha would show files from outside a sub-folder root, whatever the pathspec."""
        check_rev(rev)
        try:
            sha = self.run("rev-parse", "--verify", "--quiet", rev).strip()
        except ToolError:
            raise ToolError(f"unknown revision: {printable(rev)}") from None
        try:  # a tag peels to its commit; the sha is read as nothing else
            return self.run("rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}").strip()
        except ToolError:
            kind = self.run("cat-file", "-t", sha).strip()
        raise ToolError(
            f"{printable(rev)} is a {kind}, not a commit: give a commit, and a file as path"
        )

    def secret_excludes(self, *revs: str, paths: list[str] | None = None) -> list[str]:
        """Pathspecs leaving out the secret-looking files that revs change (one rev: that
        commit against its parents; otherwise, as git diff compares them)."""
        spec = self.pathspec(None) if paths is None else paths
        if len(revs) == 1 and paths is None:
            args = ["diff-tree", "-r", "-m", "--root", "--no-commit-id", revs[0]]
        else:
            args = ["diff", *revs]
        # SAFE_DIFF: no look into a dirty submodule, which would run its config's filters
        listed = self.run_bytes(*args, *SAFE_DIFF, "--name-only", "--no-renames", "-z", "--", *spec)
        names = {os.fsdecode(name) for name in listed.split(b"\0") if name}
        secret = sorted(n for n in names if is_secret(self.below_root(n)))
        if len(secret) > MAX_EXCLUDED:
            raise ToolError(f"{len(secret):,} secret-looking files changed; narrow with path")
        return [f":(exclude,literal){name}" for name in secret]

    def below_root(self, top_relative: str) -> str:
        """A path git gives (relative to the work tree's top) relative to the root."""
        prefix = self.relative(None)
        if prefix == ".":
            return top_relative
        return (
            top_relative[len(prefix) + 1 :]
            if top_relative.startswith(prefix + "/")
            else top_relative
        )

    def check_ignore_revs_files(self) -> None:
        """Refuses a blame.ignoreRevsFile that blame could quote from outside the root the
        user named: blame reads it and quotes, in its error, the first line that is no
        object name (no config undoes the setting). One outside the work tree is refused;
        one in the work tree but outside a sub-folder root (a top-level
        .git-blame-ignore-revs, say) passes only when every line is a comment, blank or an
        object name, so that nothing of it can show."""
        try:
            named = self.run_bytes("config", "-z", "--path", "--get-all", "blame.ignoreRevsFile")
        except ToolError:
            return  # status 1: none set
        for name in map(os.fsdecode, filter(None, named.split(b"\0"))):
            try:
                path = (self.top / name).resolve()  # git reads a relative name from the top
            except (OSError, RuntimeError):
                path = None  # a symlink loop: nothing shows it stays inside
            inside = path is not None and path.is_relative_to(self.base)
            if not inside and not (path is not None and path.is_relative_to(self.top)
                                   and _only_object_names(path)):  # fmt: skip
                raise ToolError(
                    f"blame.ignoreRevsFile names a file outside the root: {printable(name)}"
                )

    def confined(self, path: str) -> Path:
        return confine(self.base, path)

    def relative(self, path: str | None) -> str:
        """path (or the root when None) relative to the work tree's top, where git runs."""
        target = self.base if path is None else self.confined(path)
        return target.relative_to(self.top).as_posix()

    def pathspec(self, path: str | None) -> list[str]:
        """The git pathspec limiting a command to path, or to the root the user named."""
        rel = self.relative(path)
        # ":(literal)" so a name with * or ? means that file, not a glob
        return [] if rel == "." else [f":(literal){rel}"]

    def run(self, *args: str) -> str:
        return self.git.run(*args)

    def run_bytes(self, *args: str) -> bytes:
        return self.git.run_bytes(*args)


def check_rev(rev: str) -> None:
    """Refuses what git must never see as a revision: an option in disguise (--output=FILE
    writes a file), control characters, lone surrogates, a very long string."""
    if (
        not isinstance(rev, str)
        or not rev
        or len(rev) > MAX_REV_CHARS
        or rev.startswith("-")
        or not rev.isprintable()
        or any(0xD800 <= ord(char) <= 0xDFFF for char in rev)
    ):
        raise ToolError(f"bad revision: {printable(str(rev))[:80]!r}")


def split_rev(rev: str) -> tuple[str, str | None]:
    """(commit, path) of `commit:path`, path None when rev names no path. A colon inside
    braces (HEAD@{2024-03-01 12:00:00}, HEAD^{/fix: typo}) or after `:/` (a commit found by
    its message) is part of the commit. The index (`:path`, `:0:path`) is refused."""
    check_rev(rev)
    if rev.startswith(":/"):
        return rev, None
    if rev.startswith(":"):
        raise ToolError(f"the git tools read commits, not the index: {printable(rev)}")
    depth = 0
    for at, char in enumerate(rev):
        if char == "{":
            depth += 1
        elif char == "}" and depth:
            depth -= 1
        elif char == ":" and not depth:
            return rev[:at], rev[at + 1 :]
    return rev, None


def _tree_listing(repo: _Repo, obj: str, rel: str, label: str) -> str:
    """The names in a folder at a revision, `/` after folders, secrets left out."""
    listed = repo.run_bytes("ls-tree", "-z", obj)
    names: list[str] = []
    for entry in filter(None, listed.split(b"\0")):
        meta, _, raw = entry.partition(b"\t")
        name = os.fsdecode(raw)
        below = repo.below_root(name if rel == "." else f"{rel}/{name}")
        if not is_secret(below):
            names.append(show_path(name) + ("/" if meta.split(b" ")[1:2] == [b"tree"] else ""))
    return "\n".join([f"{label}: {len(names)} entries", *names])


_OBJECT_NAME = re.compile(rb"[0-9a-f]{40}([0-9a-f]{24})?")


def _only_object_names(path: Path, limit: int = 1 << 20) -> bool:
    """Whether every line of the file is blank, a # comment or a full object name (what
    blame reads from a blame.ignoreRevsFile without complaint); False for a file that is
    missing, unreadable, not a regular file or over `limit` bytes."""
    try:
        if not path.is_file() or path.stat().st_size > limit:
            return False
        data = path.read_bytes()
    except OSError:
        return False
    for line in data.splitlines():
        line = line.strip()
        if line and not line.startswith(b"#") and not _OBJECT_NAME.fullmatch(line):
            return False
    return True


def _parse_blame(porcelain: str) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    sha = author = date = ""
    for line in porcelain.split("\n"):
        if line.startswith("\t"):
            rows.append((sha, author, date, line[1:].rstrip("\r")))
        elif re.match(r"^[0-9a-f]{40} ", line):
            sha = "uncommit" if line[:40] == "0" * 40 else line[:8]
        elif line.startswith("author "):
            author = line[len("author ") :][:20]
        elif line.startswith("author-time "):
            stamp = int(line.split()[1])
            date = datetime.fromtimestamp(stamp, timezone.utc).date().isoformat()
    return rows


def _cap(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return (
        f"{text[:max_chars]}\n... truncated at {max_chars} of {len(text)} chars; narrow with path"
    )
