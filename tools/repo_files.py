"""List and read a repository's files, never stepping outside its root."""

from __future__ import annotations

import codecs
import os
import re
from pathlib import Path

import pathspec

from tools.errors import (
    BinaryFileError,
    FileTooLargeError,
    PathEscapeError,
    RootError,
    SecretPathError,
    ToolError,
    UnreadableFileError,
)
from tools.names import printable, show_path, unescape
from tools.safe_git import GitFailed, find_work_tree
from tools.secrets import is_secret, secret_reason

# Directories that are never source, even when nobody listed them in .gitignore.
ALWAYS_SKIPPED = frozenset({".git", ".venv", "node_modules", "__pycache__"})
VENV_MARKER = "pyvenv.cfg"  # the file every Python virtual environment has at its top
PSEUDO_ROOTS = ("/proc", "/sys", "/dev")
# Patterns, in gitignore's syntax, for what agentctx leaves out on top of .gitignore.
AGENTCTX_IGNORE = ".agentctxignore"
# A walk stops after this many files (`/` as the root would list millions); the packer
# then ranks and reads those.
MAX_WALKED = 100_000

# How much of a file is sniffed for NUL bytes, as git does.
SNIFF_BYTES = 8192
# Linux's PATH_MAX: no longer name opens, and git takes no longer argument.
MAX_PATH_CHARS = 4096


def resolve_root(path: str | os.PathLike[str]) -> Path:
    shown = printable(os.fspath(path))
    try:
        root = Path(path).expanduser()
        if not root.exists():
            raise RootError(f"repository path does not exist: {shown}")
        if not root.is_dir():
            raise RootError(f"not a directory: {shown}")
        resolved = root.resolve()
    except (OSError, RuntimeError) as e:  # a name too long, ~nosuchuser
        reason = getattr(e, "strerror", None) or e
        raise RootError(f"cannot use {shown} as a repository: {reason}") from None
    if any(resolved.is_relative_to(p) for p in PSEUDO_ROOTS):
        # the kernel's files: endless (/proc/kmsg blocks a reader), nothing to read about
        raise RootError(f"{shown} is a kernel file system, not a repository")
    return resolved


def confine(root: str | os.PathLike[str], rel_path: str | os.PathLike[str]) -> Path:
    """The resolved path of rel_path, which must stay inside root once symlinks are followed,
    and name no secret (tools.secrets), neither as given nor once resolved.

    A str rel_path may be in show_path's form, or carry git's quoting of unusual names
    (\\351, \\t); the literal name is taken where that form names no file.
    """
    if len(os.fspath(rel_path)) > MAX_PATH_CHARS:
        raise UnreadableFileError(f"path too long: {len(os.fspath(rel_path)):,} characters")
    base = Path(root).resolve()
    readings = _readings(rel_path) if isinstance(rel_path, str) else [rel_path]
    if len(readings) > 1:
        readings.sort(key=lambda path: not _lexists(base / path))  # stable: escapes first
    chosen = readings[0]
    label = printable(os.fspath(rel_path))
    try:
        # joining an absolute rel_path yields rel_path itself, so the check below catches it
        resolved = (base / chosen).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        # symlink loops and NUL bytes: nothing proves the path stays inside, so refuse it
        raise PathEscapeError(f"cannot resolve path inside the repository: {label}") from exc
    if not resolved.is_relative_to(base):
        raise PathEscapeError(f"path is outside the repository: {label}")
    # the name asked for (.git/config) and the file it leads to (notes.txt -> .env)
    if is_secret(os.path.normpath(os.fspath(chosen))) or is_secret(
        resolved.relative_to(base).as_posix()
    ):
        raise SecretPathError(secret_reason(label))
    return resolved


def list_files(root: str | os.PathLike[str]) -> list[str]:
    """Repo-relative POSIX paths of the files under root, sorted, ignored files left out.

    Each path is in show_path's form: the model sees it, and gives it back to the tools.
    """
    base = resolve_root(root)
    listed = _git_listing(base)
    if listed is None:
        listed = _walk_listing(base)
    kept = _not_agentctx_ignored(base, set(_outside_venvs(listed)))
    return sorted(show_path(path) for path in kept if _is_listable(base, path))


def _outside_venvs(listed: list[str]) -> list[str]:
    """The paths not inside a Python virtual environment (a folder holding pyvenv.cfg, under
    any name: venv/, env/, .tox/py311/): installed packages, not the project's files."""
    venvs = {path[: -len(VENV_MARKER)] for path in listed if path.endswith("/" + VENV_MARKER)}
    if not venvs:
        return listed
    return [p for p in listed if not any(p.startswith(v) for v in venvs)]


def head_commit(root: str | os.PathLike[str]) -> str | None:
    """The HEAD commit's sha when root is in a git work tree with commits, else None."""
    base = Path(root).resolve()
    try:
        tree = find_work_tree(base)
        if tree is None or tree.foreign or tree.ignores(base):
            # an ignored directory: the commit would describe the enclosing repo, not these
            # files; a foreign one: another repository's
            return None
        out = tree.git.run("rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except GitFailed:
        # a repository with no commits yet has a HEAD that points nowhere
        return None
    return out.strip() or None


def is_text_file(path: str | os.PathLike[str]) -> bool:
    """Whether the file's head looks like UTF-8 text; cheap, reads at most 8 KiB."""
    try:
        with open(path, "rb") as handle:
            return _head_is_text(handle.read(SNIFF_BYTES))
    except OSError:
        return False


def read_text(root: str | os.PathLike[str], rel_path: str, max_bytes: int = 1_000_000) -> str:
    """A text file's content with CRLF turned into LF, so line numbers match an editor's."""
    path = confine(root, rel_path)
    label = printable(rel_path)
    if path.exists() and not path.is_file():
        # opening a FIFO would block forever; a directory has no text
        raise UnreadableFileError(f"not a regular file: {label}")
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(SNIFF_BYTES)
            # sniff before the size check so a big image is reported as binary, not too large
            if not _head_is_text(head):
                raise BinaryFileError(f"not a text file: {label}")
            if size > max_bytes:
                raise FileTooLargeError(label, size, max_bytes)
            data = head + handle.read(max_bytes + 1 - len(head))
    except OSError as exc:
        raise UnreadableFileError(f"cannot read {label}: {exc.strerror or exc}") from exc
    if len(data) > max_bytes:  # the file grew after stat
        raise FileTooLargeError(label, len(data), max_bytes)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BinaryFileError(f"not a text file: {label} (not valid UTF-8)") from exc
    return text.replace("\r\n", "\n")


def _head_is_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        # incremental, so a multi-byte character cut at the sniff boundary is not an error
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def _readings(rel_path: str) -> list[str]:
    """The names rel_path may stand for, the unescaped one first."""
    name = unescape(rel_path)
    return [rel_path] if name is None or name == rel_path else [name, rel_path]


def _lexists(path: Path) -> bool:
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return False


def _is_listable(base: Path, rel_path: str) -> bool:
    if ALWAYS_SKIPPED.intersection(rel_path.split("/")) or is_secret(rel_path):
        return False
    try:
        # the name as it is on disk: a Path is never read as show_path's form
        resolved = confine(base, Path(rel_path))
    except ToolError:  # outside the root, or a link to a secret
        return False
    # drops deleted-but-tracked files, submodule and symlinked directories, broken links
    return resolved.is_file()


def _git_listing(base: Path) -> list[str] | None:
    """What git lists under base (tracked plus untracked, not ignored), or None if not a repo."""
    try:
        tree = find_work_tree(base)
        if tree is None or tree.foreign or tree.ignores(base):
            # an ignored directory (vendored code, a venv): git would list nothing in it,
            # so it is read as a plain directory; so is one whose git data is another
            # repository's (tree.foreign)
            return None
        # run from base: git then lists only base's subtree, relative to it;
        # -z keeps unusual names unquoted
        output = tree.git.run_bytes(
            "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=base
        )
    except GitFailed:
        # git refuses the repository (owned by someone else, or a config SafeGit cannot
        # make safe): walk it instead, which runs nothing
        return None
    # os.fsdecode keeps the bytes of a name that is not UTF-8, as os.walk does
    return [os.fsdecode(path) for path in output.split(b"\0") if path]


def _walk_listing(base: Path) -> list[str]:
    """Files under base, honouring every .gitignore on the way down, as git would."""
    found: list[str] = []
    specs: dict[str, pathspec.GitIgnoreSpec] = {}
    for dir_path, dir_names, file_names in os.walk(base):
        rel_dir = Path(dir_path).relative_to(base).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        if VENV_MARKER in file_names and rel_dir:  # a virtual environment: none of it
            dir_names[:] = []
            continue
        spec = _load_gitignore(Path(dir_path) / ".gitignore")
        if spec is not None:
            specs[rel_dir] = spec
        # pruning is right: git never re-includes a file inside an excluded directory
        dir_names[:] = [
            name
            for name in dir_names
            if name not in ALWAYS_SKIPPED and not _is_ignored(specs, _join(rel_dir, name), True)
        ]
        for name in file_names:
            rel_path = _join(rel_dir, name)
            if not _is_ignored(specs, rel_path, False):
                found.append(rel_path)
        if len(found) >= MAX_WALKED:
            break
    return found[:MAX_WALKED]


def _not_agentctx_ignored(base: Path, listed: set[str]) -> list[str]:
    """The paths that no .agentctxignore leaves out: gitignore's syntax, one file per
    directory applying below it (the deepest with a matching pattern decides), on top of
    what git ignores. Files that are not source to the reader but are tracked (fixtures,
    generated code, vendored copies) go this way."""
    folders = {""} | {rel.rsplit("/", 1)[0] for rel in listed if "/" in rel}
    folders |= {f.rsplit("/", i)[0] for f in list(folders) for i in range(1, f.count("/") + 1)}
    specs = {
        folder: spec
        for folder in folders
        if (spec := _load_gitignore(base / folder / AGENTCTX_IGNORE)) is not None
    }
    if not specs:
        return list(listed)
    kept = []
    for rel in listed:
        parts = rel.split("/")
        ancestors = ("/".join(parts[:depth]) for depth in range(1, len(parts)))
        if any(_is_ignored(specs, folder, True) for folder in ancestors):
            continue  # a directory pattern ("build/") leaves out all below it, as in git
        if not _is_ignored(specs, rel, False):
            kept.append(rel)
    return kept


def _load_gitignore(path: Path) -> pathspec.GitIgnoreSpec | None:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    # a pattern pathspec cannot compile ("[z-a]", a lone "!" or "\") is skipped and the
    # rest kept: git, too, reads such a file (it skips "!" and "\", and reads "[z-a]" as "[z]")
    return pathspec.GitIgnoreSpec.from_lines([line for line in lines if _is_usable(line)])


def _is_usable(pattern: str) -> bool:
    try:
        pathspec.GitIgnoreSpec.from_lines([pattern])
    except (ValueError, re.error):  # GitIgnorePatternError is a ValueError
        return False
    return True


def _is_ignored(specs: dict[str, pathspec.GitIgnoreSpec], rel_path: str, is_dir: bool) -> bool:
    parts = rel_path.split("/")
    # the deepest .gitignore with a matching pattern decides, as in git
    for depth in range(len(parts) - 1, -1, -1):
        spec = specs.get("/".join(parts[:depth]))
        if spec is None:
            continue
        # a trailing slash lets directory-only patterns such as "build/" match
        below = "/".join(parts[depth:]) + ("/" if is_dir else "")
        verdict = spec.check_file(below).include
        if verdict is not None:
            return verdict
    return False


def _join(rel_dir: str, name: str) -> str:
    return f"{rel_dir}/{name}" if rel_dir else name
