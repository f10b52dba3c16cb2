"""A code file's classes and functions with their lines, for the repository map and for
ranking: Python's from its syntax tree (the outline tool's parser, tools.outline), other
languages' from a cheap regex per line."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

from tools.errors import ToolError
from tools.outline import PYTHON_SUFFIXES, Definition, definitions


@dataclass(frozen=True, slots=True)
class Symbol:
    kind: str  # "class" or "def"
    name: str
    line: int
    depth: int  # 0: top level; 1: a member of the class above it


# A cheap outline for languages other than Python: (pattern, kind) per suffix, where the
# pattern's group 1 is the indentation and group 2 the name.
_IDENT = r"([A-Za-z_$][\w$]*)"
_JS = (
    (rf"^(\s*)(?:export\s+(?:default\s+)?)?(?:async\s+)?function\s*\*?\s*{_IDENT}", "def"),
    (rf"^(\s*)(?:export\s+(?:default\s+)?)?(?:abstract\s+)?class\s+{_IDENT}", "class"),
    (rf"^(\s*)(?:export\s+)?(?:interface|enum|type)\s+{_IDENT}", "class"),
    (rf"^()(?:export\s+)?(?:const|let|var)\s+{_IDENT}\s*=\s*(?:async\s*)?(?:\([^)]*\)|\w+)\s*=>", "def"),
)  # fmt: skip
_C = (
    (r"^()(?:typedef\s+)?(?:struct|class|union|enum|namespace)\s+([A-Za-z_]\w*)\s*[:{]?\s*$", "class"),
    (r"^()(?!(?:if|for|while|switch|return|else)\b)[A-Za-z_][\w\s\*&:<>,]*?[\s\*&]([A-Za-z_]\w*(?:::~?\w+)*)\s*\([^;]*$", "def"),
)  # fmt: skip
_OUTLINES: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {
    (".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx"): _JS,
    (".go",): (
        (r"^()func\s+(?:\([^)]*\)\s*)?([A-Za-z_]\w*)", "def"),
        (r"^()type\s+([A-Za-z_]\w*)", "class"),
    ),
    (".rs",): (
        (r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)", "def"),
        (r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:struct|enum|trait|union|mod)\s+(\w+)", "class"),
        (r"^(\s*)impl(?:<[^>]*>)?\s+(?:[\w:]+(?:<[^>]*>)?\s+for\s+)?([\w:]+)", "class"),
    ),
    (".java", ".kt", ".kts", ".scala", ".cs", ".swift"): (
        (r"^(\s*)(?:[a-z]+\s+)*(?:class|interface|enum|record|object|struct|protocol|trait)\s+(\w+)", "class"),
        (r"^(\s*)(?:[a-z]+\s+)*(?:fun|func|def)\s+(?:<[^>]*>\s*)?(?:\w+\.)?(\w+)", "def"),
        (r"^(\s+)(?:(?:public|private|protected|internal|static|final|abstract|synchronized|override|virtual|async)\s+)+[\w<>\[\],.? ]+?\s(\w+)\s*\(", "def"),
    ),
    (".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".cu", ".cuh", ".m"): _C,
    (".rb",): (
        (r"^(\s*)def\s+((?:self\.)?[\w?!=]+)", "def"),
        (r"^(\s*)(?:class|module)\s+([\w:]+)", "class"),
    ),
    (".php",): (
        (r"^(\s*)(?:[a-z]+\s+)*function\s+&?(\w+)", "def"),
        (r"^(\s*)(?:abstract\s+|final\s+)?(?:class|interface|trait|enum)\s+(\w+)", "class"),
    ),
    (".sh", ".bash", ".zsh"): ((r"^()(?:function\s+)?([A-Za-z_][\w-]*)\s*\(\)\s*\{?\s*$", "def"),),
    (".lua",): ((r"^(\s*)(?:local\s+)?function\s+([\w.:]+)", "def"),),
}  # fmt: skip
_COMPILED = {
    suffix: [(re.compile(pattern), kind) for pattern, kind in patterns]
    for suffixes, patterns in _OUTLINES.items()
    for suffix in suffixes
}
CODE_SUFFIXES = frozenset(PYTHON_SUFFIXES) | frozenset(_COMPILED)


def outline_symbols(path: str, text: str) -> list[Symbol]:
    """The file's classes and functions: Python's from its syntax tree (the outline tool's
    parser), other languages' from a regex per line; [] for anything else."""
    suffix = PurePosixPath(path).suffix.lower()
    if suffix in PYTHON_SUFFIXES:
        try:
            found = definitions(text, path)
        except ToolError:
            return []  # a file that does not parse is listed by its path and size
        return [
            Symbol("class" if type(node).__name__ == "ClassDef" else "def", node.name,
                   node.lineno, depth)
            for depth, node in found
        ]  # fmt: skip
    patterns = _COMPILED.get(suffix)
    if not patterns:
        return []
    symbols: list[Symbol] = []
    for number, line in enumerate(text.split("\n"), 1):
        if len(line) > 300 or not line.strip():
            continue
        for pattern, kind in patterns:
            match = pattern.match(line)
            if match:
                depth = 1 if match.group(1) else 0
                symbols.append(Symbol(kind, match.group(2), number, depth))
                break
    return symbols


def python_tree(path: str, text: str) -> ast.Module | None:
    """A Python file's syntax tree; None for another language or a file that does not parse
    (or nests too deep for the parser)."""
    if PurePosixPath(path).suffix.lower() not in PYTHON_SUFFIXES:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def walk_definitions(tree: ast.AST) -> Iterator[tuple[str, Definition, bool]]:
    """Every class and function in a syntax tree, nested ones included (also those under an
    `if` or a `with`), in source order: (its qualified name, "Encoder.encode.floatstr"; the
    node; whether a function encloses it)."""

    def walk(node: ast.AST, prefix: str, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                continue  # an expression holds no def (a lambda is none): not walked
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                yield prefix + child.name, child, in_function
                inside = in_function or not isinstance(child, ast.ClassDef)
                yield from walk(child, f"{prefix}{child.name}.", inside)
            else:
                yield from walk(child, prefix, in_function)

    yield from walk(tree, "", False)


def inner_functions(path: str, text: str) -> list[Symbol]:
    """The functions a Python file defines inside functions (depth 2: `floatstr` inside
    `JSONEncoder.iterencode`), for the excerpts; the outline and the map leave them out."""
    tree = python_tree(path, text)
    return [
        Symbol("def", node.name, node.lineno, 2)
        for _, node, inside in (walk_definitions(tree) if tree is not None else ())
        if inside and not isinstance(node, ast.ClassDef)
    ]
