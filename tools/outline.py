"""A Python file's classes and functions with their lines, to pick what to read in full."""

from __future__ import annotations

import ast
import os

from tools.errors import ToolError
from tools.names import printable
from tools.repo_files import read_text, resolve_root

PYTHON_SUFFIXES = (".py", ".pyi")

_Def = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def outline(root: str | os.PathLike[str], path: str) -> str:
    label = printable(path)
    if not path.endswith(PYTHON_SUFFIXES):
        raise ToolError(f"outline supports Python files (.py, .pyi), not {label}")
    text = read_text(resolve_root(root), path)
    total = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    rows = [
        (_span(node), "    " * depth + signature(node)) for depth, node in definitions(text, label)
    ]
    if not rows:
        return f"{label} ({total} lines): no top-level classes or functions"
    width = max(len(span) for span, _ in rows)
    body = [f"{span:>{width}}  {text}" for span, text in rows]
    return "\n".join([f"{label} ({total} lines)", *body])


def definitions(text: str, label: str) -> list[tuple[int, Definition]]:
    """(depth, node) for each top-level class or function (depth 0) and each class member
    (depth 1), in source order. ToolError where the text does not parse."""
    try:
        tree = ast.parse(text, filename=label)
    except SyntaxError as exc:
        raise ToolError(f"syntax error in {label} line {exc.lineno}: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        # absurdly deep nesting overflows the parser; there is no outline to give
        raise ToolError(f"cannot parse {label}: {type(exc).__name__}") from None
    found: list[tuple[int, Definition]] = []
    for node in tree.body:
        if isinstance(node, _Def):
            found.append((0, node))
            if isinstance(node, ast.ClassDef):
                found += [(1, child) for child in node.body if isinstance(child, _Def)]
    return found


def first_line(node: Definition) -> int:
    """The first decorator's line, so a read from there shows the whole definition."""
    return min([node.lineno] + [d.lineno for d in node.decorator_list])


def signature(node: Definition) -> str:
    # decorators such as @property or @staticmethod change how the name is used
    decorators = "".join(f"@{_unparse(d)} " for d in node.decorator_list)
    if isinstance(node, ast.ClassDef):
        bases = [_unparse(b) for b in node.bases]
        bases += [
            f"{k.arg}={_unparse(k.value)}" if k.arg else f"**{_unparse(k.value)}"
            for k in node.keywords
        ]
        return f"{decorators}class {node.name}" + (f"({', '.join(bases)})" if bases else "")
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    returns = f" -> {_unparse(node.returns)}" if node.returns else ""
    return f"{decorators}{prefix} {node.name}({_unparse(node.args)}){returns}"


def _span(node: Definition) -> str:
    return f"{first_line(node)}-{node.end_lineno or node.lineno}"


def _unparse(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except RecursionError:  # x=------...1 parses, but unparsing recurses once per "-"
        return "..."
    return text if len(text) <= 120 else text[:117] + "..."
