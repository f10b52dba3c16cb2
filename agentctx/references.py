"""References for an answer about a repository, checked against the repository itself:
where each definition the answer names lives, and what each `path:line` it cites holds.

A small model often names the right function and the wrong file, cites a line that holds
something else, or gives a bare `path:line` with no name. The references put the index's
facts beside its words: `name  path:first-last` for every class or function it names
that the repository defines in few enough places to say, and for every citation, the
definition whose lines hold it, or why it resolves to nothing (no such file, no such
line). They are computed from the files, never generated; the answer's text stays as the
model wrote it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath

from agentctx.code_outline import CODE_SUFFIXES, outline_symbols, python_tree, walk_definitions
from tools.errors import ToolError
from tools.outline import PYTHON_SUFFIXES, first_line
from tools.repo_files import list_files, read_text

MAX_REFERENCES = 8  # a longer list buries the answer it annotates
MAX_DEFINITIONS = 3  # a name defined in more places than this is not listed unqualified
MAX_FILE_BYTES = 1_000_000
NO_DEFINITION = "no class or function holds these lines"  # a citation's `why`
_FILE_SUFFIXES = CODE_SUFFIXES | frozenset(
    [".md", ".rst", ".txt", ".json", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".html", ".css"]
)
_STOP = frozenset(
    ["self", "cls", "none", "true", "false", "return", "def", "class", "function", "method",
     "file", "line", "lines", "python"]
)  # fmt: skip

_BACKTICK = re.compile(r"`([^`\n]{1,200})`")
_CALL = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\(")
_DOTTED = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w(])")
_WORD = re.compile(r"(?<![\w.])([A-Za-z_]\w*)(?![\w.])")
_KEYWORD = re.compile(r"\bclass\s+([A-Z]\w*)|\bdef\s+([A-Za-z_]\w*)")  # "the class Bar"
# a citation: path:N, path:N-M, path:LN, or a path then "line(s) N(-M)" within a few words
_PATH = r"((?:[\w.-]+/)*[\w.-]*\w\.[A-Za-z]\w*)"
_CITE = re.compile(
    rf"(?<![\w/.-]){_PATH}`?(?::\s?L?(\d+)(?:\s?[-–:]\s?L?(\d+))?(?!\d)"
    rf"|`?[^\n`.;]{{0,30}}?\blines?\s+(\d+)(?:\s?(?:-|–|to|and)\s?(\d+))?)"
)


@dataclass(frozen=True, slots=True)
class Definition:
    name: str  # qualified within its file: "JSONDecoder.raw_decode"
    path: str
    start: int  # its first line (the first decorator's)
    end: int | None  # its last line; None where only its first is known (not Python)

    def span(self) -> str:
        """`path:first-last` (`path:first` where that is all that is known)."""
        tail = f"-{self.end}" if self.end and self.end != self.start else ""
        return f"{self.path}:{self.start}{tail}"


@dataclass(frozen=True, slots=True)
class Reference:
    """One line of an answer's references: a definition it names or that holds a line it
    cites (`cited`), or a citation that resolves to nothing (`definition` None, `why`)."""

    definition: Definition | None
    cited: str = ""  # the citation as the answer wrote it
    why: str = ""

    def line(self) -> str:
        d = self.definition
        if d is None:
            return f"{self.cited}: {self.why}"
        where = f"`{d.name}`  {d.span()}"
        return f"{self.cited} is in {where}" if self.cited else where

    def data(self) -> dict:
        out = {"cited": self.cited or None, "why": self.why or None}
        out["definition"] = asdict(self.definition) if self.definition else None
        return out


def render(references: list[Reference]) -> str:
    """The references as a block to show under the answer ("" when there are none)."""
    if not references:
        return ""
    return "References (checked against the files):\n" + "\n".join(
        f"- {r.line()}" for r in references
    )


def for_answer(answer: str, root: str | None, kind: str = "repo") -> list[Reference]:
    """The references shown under a turn's answer: none for a book, an empty answer, or a
    repository that cannot be listed now (they annotate an answer, never fail its turn)."""
    if kind != "repo" or not root or not answer.strip():
        return []
    try:
        return references(answer, root)
    except (ToolError, OSError):
        return []


def references(answer: str, root: str, files: list[str] | None = None,
               index: Index | None = None) -> list[Reference]:  # fmt: skip
    """The references of `answer` about the repository at `root` (its listable files:
    ignored files and secrets are never read); `index`, one over those files to share (the
    files it reads and parses are read and parsed once)."""
    names = named(answer)
    citations = _citations(answer)
    if not names and not citations:
        return []
    if index is None:
        index = Index(root, list_files(root) if files is None else files)
    out: list[Reference] = []
    for cited, written, start, end in citations:
        out.append(index.cited(cited, written, start, end))
    mentioned = {index.file_of(m.group(1)) for m in re.finditer(_PATH, answer)} - {None}
    # a bare name the answer also cites is left to its citation: the cited line says which
    # of the name's definitions it means
    cited = {last_name(r.definition.name) for r in out if r.definition is not None}
    names = [n for n in names if "." in n or n not in cited]
    index.find({last_name(n) for n in names})
    for name in names:
        for d in index.named(name, mentioned):
            out.append(Reference(d))
    return _unique(out)[:MAX_REFERENCES]


def named(answer: str) -> list[str]:
    """The code names an answer writes: in backticks, called, dotted, snake_case or
    CamelCase, or after "class" or "def"; in order, each once."""
    found: list[str] = []
    for span in _BACKTICK.findall(answer):
        head = re.match(r"(?:(?:async\s+)?def\s+|class\s+|@)?([A-Za-z_][\w.]*)", span.strip())
        if head and "/" not in span:
            found.append(head.group(1))
    plain = _BACKTICK.sub(" ", answer)
    plain = re.sub(_PATH, lambda m: " " if _is_path(m.group(1)) else m.group(1), plain)
    found += _CALL.findall(plain) + _DOTTED.findall(plain)
    found += [a or b for a, b in _KEYWORD.findall(plain)]
    for word in _WORD.findall(plain):
        inner = word.strip("_")
        if ("_" in inner or word.startswith("_")) or (
            word[0].isupper()
            and any(c.islower() for c in word)
            and any(c.isupper() for c in word[1:])
        ):
            found.append(word)
    out: list[str] = []
    for name in found:
        name = name.strip(".")
        if name and name.casefold() not in _STOP and name not in out:
            out.append(name)
    return out


def _citations(answer: str) -> list[tuple[str, str, int, int]]:
    """(as written, the path, first line, last line) of each citation, in order."""
    out = []
    for m in _CITE.finditer(answer):
        first, last = (m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5))
        start = int(first)
        end = int(last) if last else start
        cited = f"{m.group(1)}:{start}" + (f"-{end}" if end != start else "")
        out.append((cited, m.group(1), start, end))
    return out


class Index:
    """The repository's definitions, parsed from the files that hold a name asked about."""

    def __init__(self, root: str, files: list[str]) -> None:
        self.root, self.files = root, files
        self._texts: dict[str, str | None] = {}  # the files cited
        self._defs: dict[str, list[Definition]] = {}
        self._by_name: dict[str, list[Definition]] = {}  # find's: definitions by last name

    def file_of(self, written: str) -> str | None:
        """The one file a written path names: itself, or the one file it is the tail of."""
        token = written.strip("`'\"*()[]<>,;").removeprefix("./").lstrip("/")
        stem, dot, suffix = token.rpartition(".")
        readings = [token]
        if dot and "/" not in token and "." in stem:  # click.core.py: a module's dotted name
            readings.append(f"{stem.replace('.', '/')}.{suffix}")
        for reading in readings:
            if reading in self.files:
                return reading
            tails = [f for f in self.files if f.endswith("/" + reading)]
            if len(tails) == 1:
                return tails[0]
        return None

    def text(self, path: str) -> str | None:
        if path not in self._texts:
            self._texts[path] = self._read(path)
        return self._texts[path]

    def _read(self, path: str) -> str | None:
        try:
            return read_text(self.root, path, MAX_FILE_BYTES)
        except (ToolError, OSError):
            return None

    def definitions(self, path: str, text: str | None = None) -> list[Definition]:
        if path not in self._defs:
            text = self.text(path) if text is None else text
            self._defs[path] = [] if text is None else _definitions(path, text)
        return self._defs[path]

    def find(self, names: set[str]) -> None:
        """The definitions of these names, from one pass over the code files: a file is
        parsed only when one of the names occurs in it as a word (no file is kept)."""
        names = {n for n in names if n}
        if not names:
            return
        word = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(names))) + r")\b")
        self._by_name = {n: [] for n in names}
        for path in self.files:
            if not is_code(path):
                continue
            text = self._texts.get(path) or self._read(path)
            if text is None or not word.search(text):
                continue
            for d in self.definitions(path, text):
                found = self._by_name.get(last_name(d.name))
                if found is not None:
                    found.append(d)

    def found(self, name: str) -> list[Definition]:
        """The definitions `find` found of a name (its last part)."""
        return list(self._by_name.get(last_name(name), ()))

    def cited(self, cited: str, written: str, start: int, end: int) -> Reference:
        path = self.file_of(written)
        if path is None:
            return Reference(None, cited, f"no single file of the repository is {written}")
        text = self.text(path)
        if text is None:
            return Reference(None, cited, f"{path} cannot be read")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if not 1 <= start <= end <= len(lines):
            return Reference(None, cited, f"{path} has {len(lines)} lines")
        skipped = 0  # a blank line or two just above a definition point at it
        while skipped < 2 and start < len(lines) and not lines[start - 1].strip():
            start, skipped = start + 1, skipped + 1
        end = max(end, start)
        holding = [
            d for d in self.definitions(path)
            if d.end is not None and d.start <= end and start <= d.end
        ]  # fmt: skip
        if not holding:
            return Reference(None, cited, NO_DEFINITION)
        # the innermost definition that holds the first cited line, else the first one cited
        inner = [d for d in holding if d.start <= start <= d.end]
        best = max(inner, key=lambda d: d.start) if inner else min(holding, key=lambda d: d.start)
        return Reference(best, cited)

    def named(self, name: str, mentioned: set[str]) -> list[Definition]:
        """The definitions of `name` (qualified or not): all of them when there are at most
        MAX_DEFINITIONS, else those in the files the answer names, else none."""
        parts = name.split(".")
        last = parts[-1]
        if last.startswith("__") and len(parts) == 1:
            return []  # __init__ alone names nothing in particular
        candidates = list(self._by_name.get(last, ()))
        if len(parts) > 1:
            qualifier = parts[-2]
            narrowed = [
                d for d in candidates
                if qualifier in d.name.split(".")[:-1] or qualifier in _module_parts(d.path)
            ]  # fmt: skip
            candidates = narrowed or candidates
        # a name defined again in its file (after @overload stubs, or redefined): the last
        # definition is the one that runs
        candidates = list({(d.name, d.path): d for d in candidates}.values())
        if len(candidates) > MAX_DEFINITIONS:
            candidates = [d for d in candidates if d.path in mentioned]
        return candidates if len(candidates) <= MAX_DEFINITIONS else []


def _definitions(path: str, text: str) -> list[Definition]:
    if PurePosixPath(path).suffix.lower() not in PYTHON_SUFFIXES:
        return [Definition(s.name, path, s.line, None) for s in outline_symbols(path, text)]
    tree = python_tree(path, text)
    return [
        Definition(name, path, first_line(node), node.end_lineno)
        for name, node, _ in (walk_definitions(tree) if tree is not None else ())
    ]


def last_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _is_path(written: str) -> bool:
    """A written path (a folder in it, or a file's suffix), not a dotted name."""
    return "/" in written or PurePosixPath(written).suffix.lower() in _FILE_SUFFIXES


def is_code(path: str) -> bool:
    return PurePosixPath(path).suffix.lower() in CODE_SUFFIXES


def _module_parts(path: str) -> list[str]:
    return list(PurePosixPath(path).with_suffix("").parts)


def _unique(refs: list[Reference]) -> list[Reference]:
    """Each reference once; a definition both cited and named is left to its citation."""
    out: list[Reference] = []
    for r in refs:
        if (r.cited and r not in out) or all(o.definition != r.definition for o in out):
            out.append(r)
    return out
