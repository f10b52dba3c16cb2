"""What a definition's own lines say, for the model asked a question again: the first line of
its docstring, and where it raises what.

An answer check (agentctx.answer_check) that sends an answer back shows the model where each
line it cited lands and where each name it gave is defined. A small model asked "what does
`find_root` return" or "what does it raise" then often writes the same answer again: a
place is not what was asked. The definition's docstring ("Finds the outermost context.") and
its `raise` lines (`raise ValueError(...)` at agg.py:104) are; they are read from the files,
never generated.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import PurePosixPath

from agentctx.references import Definition, Index
from tools.outline import PYTHON_SUFFIXES

MAX_RAISES = 2  # raise lines shown per definition
MAX_SUMMARY = 160  # characters of a docstring's first line
_RAISE = re.compile(r"^[ \t]*raise[ \t]+(\S.*)$", re.M)


def facts(index: Index, definition: Definition, raises: bool) -> list[str]:
    """Lines for the model about one Python definition: what its docstring says first, and
    (`raises`) where it raises what; [] for other files, or where nothing is found."""
    d = definition
    if d.end is None or PurePosixPath(d.path).suffix.lower() not in PYTHON_SUFFIXES:
        return []
    text = index.text(d.path)
    if text is None:
        return []
    source = "\n".join(text.split("\n")[d.start - 1 : d.end])
    node = _node(source)
    if node is None:
        return []
    out = []
    doc = ast.get_docstring(node) or ""
    summary = " ".join(doc.strip().split("\n\n", 1)[0].split())[:MAX_SUMMARY]
    if summary:
        out.append(f'`{d.name}` ({d.span()}) says: "{summary}"')
    if raises and not isinstance(node, ast.ClassDef):  # a class's raise lines are its methods'
        for m in list(_RAISE.finditer(source))[:MAX_RAISES]:
            line = d.start + source.count("\n", 0, m.start())
            out.append(f"`{d.name}` raises at {d.path}:{line}: `raise {m.group(1).strip()[:120]}`")
    return out


def _node(source: str) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | None:
    """The definition whose lines `source` is (None where they do not parse alone)."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
