"""Check the product code against the layout rules: no file over 400 lines, no class
over 15 methods, no function over 8 parameters (click commands and Triton kernels
excepted), and no
environment variable read in engine/.

    python -m scripts.structure_check          # prints each breach, exit 1 if any
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PRODUCT = ("agentctx", "engine", "kernels", "tools", "sessions")
MAX_LINES = 400
MAX_METHODS = 15
MAX_PARAMS = 8


def _exempt(fn: ast.AST) -> bool:
    """A click command's parameters are its options; a Triton kernel's are its launch ABI."""
    for dec in getattr(fn, "decorator_list", []):
        node = dec.func if isinstance(dec, ast.Call) else dec
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        if name in {"command", "group", "option", "argument", "pass_context", "jit", "autotune"}:
            return True
    return False


def _param_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    names = [n for n in names if n.arg not in {"self", "cls"}]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def _reads_env(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in {"environ", "getenv"}
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            lines.append(node.lineno)
    return lines


def breaches(root: Path) -> list[str]:
    found: list[str] = []
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            text = path.read_text(encoding="utf-8")
            n = text.count("\n")
            if n > MAX_LINES:
                found.append(f"{rel}: {n} lines (max {MAX_LINES})")
            tree = ast.parse(text, filename=str(rel))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    methods = [
                        b
                        for b in node.body
                        if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))
                    ]
                    if len(methods) > MAX_METHODS:
                        found.append(
                            f"{rel}:{node.lineno}: class {node.name} has {len(methods)}"
                            f" methods (max {MAX_METHODS})"
                        )
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    k = _param_count(node)
                    if k > MAX_PARAMS and not _exempt(node):
                        found.append(
                            f"{rel}:{node.lineno}: {node.name}() takes {k} parameters"
                            f" (max {MAX_PARAMS})"
                        )
            if top == "engine":
                for line in _reads_env(tree):
                    found.append(f"{rel}:{line}: reads the environment")
    return found


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    found = breaches(root)
    for line in found:
        print(line)
    print(f"{len(found)} breaches", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
