"""outline on code that parses but is too deep to unparse, or to parse at all."""

from __future__ import annotations

from pathlib import Path

from tools.registry import run_tool

from .support import UNFORESEEN


def test_a_default_too_deep_to_unparse_is_elided(tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text("def f(x=" + "-" * 900 + "1): pass\n")
    assert run_tool(tmp_path, "outline", {"path": "f.py"}) == "f.py (1 lines)\n1-1  def f(...)"


def test_nesting_too_deep_to_parse_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "g.py").write_text("x = " + "(" * 5000 + "1" + ")" * 5000 + "\n")
    result = run_tool(tmp_path, "outline", {"path": "g.py"})
    assert result.startswith("error: ") and not result.startswith(UNFORESEEN)
    assert "\n" not in result
