"""The tools as an LLM sees them: names, descriptions, JSON-schema parameters, one runner."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tools import book, git_tools, grep, outline, read_file, repo_files
from tools.errors import ToolError
from tools.names import no_surrogates

# JSON-schema type names and the Python values that satisfy them.
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of type "object"
    func: Callable[..., str]  # called as func(root, **arguments)
    kind: str  # "repo": root is a directory; "book": root is the book's file

    def schema(self) -> dict[str, Any]:
        """The function-calling form most chat templates take."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def _params(required: tuple[str, ...] = (), **props: tuple[Any, ...]) -> dict[str, Any]:
    """A schema from name=(type, description[, minimum]); integers start at 1 by default."""
    properties: dict[str, Any] = {}
    for name, (kind, description, *minimum) in props.items():
        properties[name] = {"type": kind, "description": description}
        if kind == "integer":
            properties[name]["minimum"] = minimum[0] if minimum else 1
    return {"type": "object", "properties": properties, "required": list(required)}


def _list_files(root: str | os.PathLike[str], max_files: int = 1000) -> str:
    paths = repo_files.list_files(root)
    if not paths:
        return "no files"
    shown = paths[:max_files]
    if len(paths) > max_files:
        shown.append(f"... {len(paths) - max_files} more files; use grep with path_glob")
    return "\n".join([f"{len(paths)} files", *shown])


_CITATION = re.compile(r"(.+?):(\d+)(?:-(\d+))?(?::.*)?", re.S)


def _read_file(root, path: str, start: int = 1, end: int | None = None, max_lines: int = 400):
    """read_file, where a path that names no file may be a citation, path:line or
    path:start-end (or a grep match, path:line: text), as models copy them."""
    try:
        return read_file.read_file(root, path, start, end, max_lines)
    except ToolError:
        cited = _CITATION.fullmatch(path)
        if cited is None or start != 1 or end is not None:
            raise
        line, last = int(cited[2]), int(cited[3]) if cited[3] else None
        try:
            return read_file.read_file(root, cited[1], max(line, 1), last, max_lines)
        except ToolError:
            pass
        raise


_PATH = ("string", "file path relative to the repository root")
_START = ("integer", "first line, 1-based")
_END = ("integer", "last line, inclusive (default: end of file)")
_REV = ("string", "a git revision: sha, branch, tag, HEAD~2, ...")
_MAX_LINES = ("integer", "most lines to return")

_SPECS = [
    ToolSpec(
        "list_files",
        "List the repository's files (ignored files left out), one path a line.",
        _params(max_files=("integer", "most paths to list (default 1000)")),
        _list_files,
        "repo",
    ),
    ToolSpec(
        "read_file",
        "Read a text file's lines, numbered, from start to end.",
        _params(("path",), path=_PATH, start=_START, end=_END, max_lines=_MAX_LINES),
        _read_file,
        "repo",
    ),
    ToolSpec(
        "grep",
        "Search text files with a Python regex; answers path:line: text lines.",
        _params(
            ("pattern",),
            pattern=("string", "Python regular expression, matched per line"),
            path_glob=("string", "only files matching this gitignore-style glob, e.g. *.py"),
            ignore_case=("boolean", "match case-insensitively"),
            max_matches=("integer", "most matches to list (default 200)"),
        ),
        grep.grep,
        "repo",
    ),
    ToolSpec(
        "git_log",
        "Recent commits, newest first: short sha, date, author, subject.",
        _params(
            path=("string", "only commits touching this file or directory"),
            max_count=("integer", "most commits (default 20)"),
        ),
        git_tools.git_log,
        "repo",
    ),
    ToolSpec(
        "git_show",
        "Show a commit (message, stat and patch), or a file's content at a revision when path is given.",
        _params(rev=_REV, path=_PATH, max_chars=("integer", "most characters (default 20000)")),
        git_tools.git_show,
        "repo",
    ),
    ToolSpec(
        "git_diff",
        "Diff: no revisions = working tree vs HEAD; rev_a = working tree vs rev_a; both = rev_a vs rev_b.",
        _params(
            rev_a=_REV,
            rev_b=_REV,
            path=("string", "limit the diff to this file or directory"),
            max_chars=("integer", "most characters (default 20000)"),
        ),
        git_tools.git_diff,
        "repo",
    ),
    ToolSpec(
        "git_blame",
        "Who last changed each line: sha author date line| text.",
        _params(("path",), path=_PATH, start=_START, end=_END, max_lines=_MAX_LINES),
        git_tools.git_blame,
        "repo",
    ),
    ToolSpec(
        "outline",
        "A Python file's classes, functions and methods with line ranges and signatures.",
        _params(("path",), path=_PATH),
        outline.outline,
        "repo",
    ),
    ToolSpec(
        "chapters",
        "The book's chapters: index, title, line range and word count.",
        _params(),
        book.list_chapters,
        "book",
    ),
    ToolSpec(
        "read_chapter",
        "Read one chapter by its index from the chapters list, as numbered lines.",
        _params(
            ("index",),
            index=("integer", "chapter index (0 is front matter)", 0),
            max_lines=_MAX_LINES,
        ),
        book.read_chapter,
        "book",
    ),
    ToolSpec(
        "read_lines",
        "Read the book's lines from start to end, numbered.",
        _params(("start",), start=_START, end=_END, max_lines=_MAX_LINES),
        book.read_lines,
        "book",
    ),
    ToolSpec(
        "search_book",
        "Find a phrase in the book (case-insensitive); answers 'chapter N, line L: text'.",
        _params(
            ("query",),
            query=("string", "text to find, or a Python regex when regex is true"),
            regex=("boolean", "treat query as a regular expression"),
            max_matches=("integer", "most matches (default 50)"),
        ),
        book.search_book,
        "book",
    ),
]

TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in _SPECS}
REPO_TOOLS = tuple(name for name, spec in TOOLS.items() if spec.kind == "repo")
BOOK_TOOLS = tuple(name for name, spec in TOOLS.items() if spec.kind == "book")


def schemas(names: tuple[str, ...] | list[str] = REPO_TOOLS) -> list[dict[str, Any]]:
    return [TOOLS[name].schema() for name in names]


def run_tool(root: str | os.PathLike[str], name: str, arguments: dict[str, Any] | None) -> str:
    """The tool's text, or "error: ..." text: the model reads errors and tries again."""
    # the tools show file names printable; this is for what slips past them (an OS error's
    # file name, git's stderr): no tokenizer takes the surrogates of undecodable bytes
    return no_surrogates(_run_tool(root, name, arguments))


def signature(name: str) -> str:
    """A tool's call as a model should write it: grep(pattern: string, path_glob?: string)."""
    spec = TOOLS[name]
    required = spec.parameters["required"]
    args = ", ".join(
        f"{key}{'' if key in required else '?'}: {schema['type']}"
        for key, schema in spec.parameters["properties"].items()
    )
    return f"{name}({args})"


def unknown_tool_error(name: str, offered: tuple[str, ...] | list[str]) -> str:
    """What a model that called a tool it was not offered is told: the tools it has."""
    listed = "; ".join(signature(n) for n in offered)
    return f"unknown tool {name!r}: the only tools are {listed}"


def argument_error(name: str, arguments: dict[str, Any] | None) -> str | None:
    """Why the arguments do not fit the tool's schema, with its signature; None if they do."""
    try:
        validate(TOOLS[name], arguments)
    except ToolError as exc:
        return f"{exc}; call it as {signature(name)} (? marks an optional argument)"
    return None


def _run_tool(root: str | os.PathLike[str], name: str, arguments: dict[str, Any] | None) -> str:
    spec = TOOLS.get(name)
    if spec is None:
        return f"error: unknown tool {name!r}; tools: {', '.join(TOOLS)}"
    try:
        kwargs = validate(spec, arguments)
        return spec.func(root, **kwargs)
    except ToolError as exc:
        return f"error: {exc}"
    except OSError as exc:
        # a race with the file system, or a file the checks did not foresee
        where = f": {exc.filename}" if exc.filename else ""
        return f"error: {exc.strerror or exc}{where}"
    except Exception as exc:
        # a bug in a tool: no test's hostile argument gets here (tests/reliability), but a
        # traceback would end the whole answer, so the model reads one line instead
        return f"error: internal error in {name}: {type(exc).__name__}: {str(exc)[:300]}"


def validate(spec: ToolSpec, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """Arguments checked against the schema; null for an optional one means left out."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolError(f"{spec.name} takes an object of named arguments")
    properties = spec.parameters["properties"]
    required = spec.parameters["required"]
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        expected = ", ".join(properties) or "none"
        raise ToolError(f"unknown argument {unknown[0]!r} for {spec.name}; expected: {expected}")
    kwargs = {key: value for key, value in arguments.items() if value is not None}
    missing = [key for key in required if key not in kwargs]
    if missing:
        raise ToolError(f"{spec.name} needs argument {missing[0]!r}")
    for key, value in kwargs.items():
        schema = properties[key]
        kind = schema["type"]
        # bool is an int in Python, but true is no line number
        if not isinstance(value, _TYPES[kind]) or (kind == "integer" and isinstance(value, bool)):
            article = "an" if kind == "integer" else "a"
            raise ToolError(
                f"argument {key!r} of {spec.name} must be {article} {kind}, got {value!r}"
            )
        if "minimum" in schema and value < schema["minimum"]:
            raise ToolError(f"argument {key!r} of {spec.name} must be {schema['minimum']} or more")
    return kwargs
