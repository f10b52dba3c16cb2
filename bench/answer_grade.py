"""Grading an answer about a repository: does it name the right file and symbol, and do its
`path:line` citations point at what the answer says is there?

- The file counts as named when the answer mentions its path, or a shorter tail of it (a
  basename) that no other file of the repository ends with, or its module's dotted name
  (`json.decoder` for json/decoder.py).
- The symbol counts as named when its name (the last part of a qualified name such as
  `JSONDecoder.raw_decode`) appears as a whole identifier.
- A fact, where the question has one, counts when any of its alternatives appears
  (case-insensitive).
- A citation is `path:N` or `path:N-M` (not `path:N lines`, a size). It resolves when the path names one file of the
  repository, the lines exist, and the identifiers the answer puts beside it (backticked
  code, calls, snake_case, CamelCase and dotted names, names next to "function", "class",
  "method") include one that appears on a cited line or names a def/class enclosing one.
  A citation with no identifier beside it resolves when its lines exist; it is counted as
  unchecked.
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

MAX_CITED_LINES = 400  # a range wider than this says nothing about where a thing is
CLAIM_WINDOW = 100  # characters each side of a citation searched for what it claims

_CITATION = re.compile(
    r"(?<![\w/.-])(/?(?:[\w.-]+/)*[\w.-]*\w\.[A-Za-z]\w*)"  # a path with a suffix
    r"(?:`|\*\*)?:\s?L?(\d+)(?:\s?[-–]\s?L?(\d+))?(?![\d])"
)
_LINE_COUNT = re.compile(r"\s*lines?\b")
_PATH = re.compile(r"(?<![\w/.-])(/?(?:[\w.-]+/)*[\w.-]*\w\.[A-Za-z]\w*)(?![\w/])")
_DOTTED = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?!\w)")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_WORD_PAIR = re.compile(r"\w\w")
_BACKTICKS = re.compile(r"`([^`\n]+)`")
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s?\(")
_KEYWORD_AFTER = re.compile(r"\b(?:def|class|function|method|attribute)\s+`?([A-Za-z_]\w*)")
_KEYWORD_BEFORE = re.compile(r"([A-Za-z_]\w*)`?\s+(?:function|method|class|attribute)\b")
# words that sit next to a citation without naming anything in the code
_NOT_CLAIMS = frozenset(
    ["self", "cls", "none", "true", "false", "return", "returns", "def", "class", "function",
     "method", "the", "a", "an", "in", "at", "of", "is", "it", "this", "that", "and", "or",
     "to", "line", "lines", "file", "py", "are", "was", "were", "be", "can", "for", "from",
     "with", "by", "as", "on", "which", "where", "here", "there", "you", "we", "its", "has"]
)  # fmt: skip


@dataclass
class Citation:
    text: str  # as written, e.g. "json/decoder.py:343-356"
    path: str  # the path as written
    start: int
    end: int
    file: str | None = None  # the repository file it names; None if none or several
    claims: list[str] = field(default_factory=list)  # identifiers written beside it
    resolved: bool = False
    why: str = ""  # what failed, or "unchecked" when nothing was claimed


@dataclass
class Grade:
    file_ok: bool  # some acceptable answer's file is named
    symbol_ok: bool  # some acceptable answer's symbol is named
    pair_ok: bool  # one acceptable answer's file and symbol are both named
    fact_ok: bool  # True when the question asks for no fact
    citations: list[Citation]

    @property
    def correct(self) -> bool:
        return self.pair_ok and self.fact_ok

    @property
    def citations_resolved(self) -> int:
        return sum(c.resolved for c in self.citations)

    def to_dict(self) -> dict:
        return {
            "correct": self.correct,
            "file_ok": self.file_ok,
            "symbol_ok": self.symbol_ok,
            "pair_ok": self.pair_ok,
            "fact_ok": self.fact_ok,
            "citations": [asdict(c) for c in self.citations],
            "citations_resolved": self.citations_resolved,
        }


@dataclass(frozen=True)
class Expected:
    """One acceptable answer: the file and the (possibly qualified) symbol."""

    file: str
    symbol: str


class RepoIndex:
    """A repository's files, their lines, and the def/class spans of its Python files."""

    def __init__(self, root: str | Path, files: list[str] | None = None) -> None:
        self.root = Path(root)
        if files is None:
            files = sorted(
                p.relative_to(self.root).as_posix()
                for p in self.root.rglob("*")
                if p.is_file() and ".git" not in p.relative_to(self.root).parts
            )
        self.files = files
        self._lines: dict[str, list[str]] = {}
        self._spans: dict[str, list[tuple[int, int, str]]] = {}

    def lines(self, path: str) -> list[str]:
        if path not in self._lines:
            text = (self.root / path).read_text(encoding="utf-8", errors="replace")
            self._lines[path] = text.split("\n")
            if self._lines[path] and self._lines[path][-1] == "":
                self._lines[path].pop()
        return self._lines[path]

    def spans(self, path: str) -> list[tuple[int, int, str]]:
        """(first line, last line, name) of every def and class, nested ones included."""
        if path not in self._spans:
            self._spans[path] = []
            if path.endswith(".py"):
                try:
                    tree = ast.parse("\n".join(self.lines(path)))
                except (SyntaxError, ValueError):
                    tree = None
                for node in ast.walk(tree) if tree is not None else ():
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                        self._spans[path].append((first, node.end_lineno, node.name))
        return self._spans[path]

    def enclosing(self, path: str, line: int) -> set[str]:
        return {name for first, last, name in self.spans(path) if first <= line <= last}

    def resolve(self, written: str) -> str | None:
        """The one repository file a written path names: itself, a longer path ending with
        it (a basename), or one it ends with (an absolute path); None if none or several."""
        token = written.strip("`'\"*()[]<>,;").removeprefix("./").lstrip("/")
        if not token:
            return None
        if token in self.files:
            return token
        inside = [f for f in self.files if token.endswith("/" + f)]
        if inside:
            return max(inside, key=len)
        tails = [f for f in self.files if f.endswith("/" + token)]
        return tails[0] if len(tails) == 1 else None

    def module_file(self, dotted: str) -> str | None:
        """The file of a dotted module name, or of its longest module prefix."""
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            base = "/".join(parts[:n])
            for candidate in (base + ".py", base + "/__init__.py"):
                if candidate in self.files:
                    return candidate
        return None


def names_file(answer: str, expected_file: str, repo: RepoIndex) -> bool:
    for match in _PATH.finditer(answer):
        if repo.resolve(match.group(1)) == expected_file:
            return True
    return any(repo.module_file(m.group(1)) == expected_file for m in _DOTTED.finditer(answer))


def names_symbol(answer: str, symbol: str) -> bool:
    name = symbol.rsplit(".", 1)[-1]
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", answer) is not None


def has_fact(answer: str, facts: list[str] | tuple[str, ...]) -> bool:
    if not facts:
        return True
    low = answer.casefold()
    return any(f.casefold() in low for f in facts)


def claims_in(text: str) -> list[str]:
    """Identifiers in a stretch of answer text that name code."""
    found: list[str] = []
    found += [_code_name(span) for span in _BACKTICKS.findall(text)]
    found += _CALL.findall(text)
    found += _KEYWORD_AFTER.findall(text) + _KEYWORD_BEFORE.findall(text)
    for word in _IDENT.findall(_BACKTICKS.sub(" ", text)):
        if "_" in word.strip("_") or word.startswith("_") or _is_camel(word):
            found.append(word)
    found += [m.group(1) for m in _DOTTED.finditer(text)]
    out: list[str] = []
    for name in found:
        name = name.strip(".")
        if name and name.casefold() not in _NOT_CLAIMS and name not in out:
            out.append(name)
    return out


def _code_name(span: str) -> str:
    """`JSONDecoder.raw_decode(s, idx=0)` -> JSONDecoder.raw_decode; `def foo` -> foo."""
    span = span.strip()
    span = re.sub(r"^(?:def|class|async def)\s+", "", span)
    head = re.match(r"[A-Za-z_][\w.]*", span)
    return head.group(0) if head else ""


def _is_camel(word: str) -> bool:
    return (
        word[0].isupper() and any(c.islower() for c in word) and any(c.isupper() for c in word[1:])
    )


def find_citations(answer: str, repo: RepoIndex) -> list[Citation]:
    out: list[Citation] = []
    # "json/tool.py:85 lines" copies a file's header, "=== json/tool.py (85 lines) ===":
    # a size, not a place
    matches = [m for m in _CITATION.finditer(answer) if not _LINE_COUNT.match(answer, m.end())]
    for i, m in enumerate(matches):
        start = int(m.group(2))
        end = int(m.group(3)) if m.group(3) else start
        cite = Citation(m.group(0), m.group(1), start, end, repo.resolve(m.group(1)))
        line_start = answer.rfind("\n", 0, m.start()) + 1
        line_end = answer.find("\n", m.end())
        line_end = len(answer) if line_end < 0 else line_end
        before_from = max(line_start, m.start() - CLAIM_WINDOW)
        if i and matches[i - 1].end() > before_from:
            before_from = matches[i - 1].end()
        while before_from > line_start and _WORD_PAIR.match(answer, before_from - 1):
            before_from += 1  # the window starts at a word, not in one ("he" of "The")
        after_to = min(line_end, m.end() + CLAIM_WINDOW)
        if i + 1 < len(matches) and matches[i + 1].start() < after_to:
            after_to = matches[i + 1].start()
        before = _without_paths(answer[before_from : m.start()], repo)
        after = _without_paths(answer[m.end() : after_to], repo)
        cite.claims = claims_in(before) or claims_in(after)
        _check(cite, repo)
        out.append(cite)
    return out


def _without_paths(text: str, repo: RepoIndex) -> str:
    """The text with file paths blanked out (a dotted name such as json.loads stays)."""

    def blank(m: re.Match) -> str:
        return " " if "/" in m.group(1) or repo.resolve(m.group(1)) else m.group(0)

    return _PATH.sub(blank, text)


def _check(cite: Citation, repo: RepoIndex) -> None:
    if cite.file is None:
        cite.why = f"no single file of the repository is {cite.path}"
        return
    lines = repo.lines(cite.file)
    if not 1 <= cite.start <= cite.end <= len(lines):
        cite.why = f"{cite.file} has {len(lines)} lines"
        return
    if cite.end - cite.start + 1 > MAX_CITED_LINES:
        cite.why = f"a range of more than {MAX_CITED_LINES} lines"
        return
    if not cite.claims:
        cite.resolved, cite.why = True, "unchecked"
        return
    cited = range(cite.start, cite.end + 1)
    enclosing = set().union(*(repo.enclosing(cite.file, n) for n in cited))
    for claim in cite.claims:
        name = claim.rsplit(".", 1)[-1]
        pattern = re.compile(rf"(?<![\w]){re.escape(name)}(?![\w])")
        if name in enclosing or any(pattern.search(lines[n - 1]) for n in cited):
            cite.resolved = True
            return
    cite.why = f"{', '.join(cite.claims)} not at {cite.file}:{cite.start}-{cite.end}"


def grade(
    answer: str, expected: list[Expected], repo: RepoIndex, facts: tuple[str, ...] = ()
) -> Grade:
    """Grade an answer against the acceptable (file, symbol) pairs; the file and symbol of
    one pair must both be named."""
    pairs = [(names_file(answer, e.file, repo), names_symbol(answer, e.symbol)) for e in expected]
    return Grade(
        file_ok=any(f for f, _ in pairs),
        symbol_ok=any(s for _, s in pairs),
        pair_ok=any(f and s for f, s in pairs),
        fact_ok=has_fact(answer, facts),
        citations=find_citations(answer, repo),
    )
