"""scripts/structure_check.py finds each kind of breach, and exempts what it says it exempts."""

from pathlib import Path

from scripts.structure_check import breaches


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_clean_tree_has_no_breaches(tmp_path):
    _write(tmp_path, "engine/ok.py", "def f(a, b):\n    return a + b\n")
    assert breaches(tmp_path) == []


def test_each_rule_is_found(tmp_path):
    _write(tmp_path, "agentctx/long.py", "x = 1\n" * 401)
    methods = "".join(f"    def m{i}(self):\n        pass\n" for i in range(16))
    _write(tmp_path, "sessions/big.py", f"class Big:\n{methods}")
    _write(tmp_path, "tools/wide.py", "def wide(a, b, c, d, e, f, g, h, *, i):\n    pass\n")
    _write(tmp_path, "engine/flags.py", "import os\n\nX = os.environ.get('FLAG')\n")
    found = "\n".join(breaches(tmp_path))
    assert "agentctx/long.py: 401 lines" in found
    assert "class Big has 16 methods" in found
    assert "wide() takes 9 parameters" in found
    assert "engine/flags.py:3: reads the environment" in found


def test_limits_are_inclusive_and_exemptions_hold(tmp_path):
    _write(tmp_path, "kernels/edge.py", "x = 1\n" * 400)
    methods = "".join(f"    def m{i}(self):\n        pass\n" for i in range(15))
    _write(tmp_path, "sessions/fifteen.py", f"class Fifteen:\n{methods}")
    _write(tmp_path, "tools/eight.py", "def eight(self, a, b, c, d, e, f, g, h):\n    pass\n")
    _write(
        tmp_path,
        "kernels/k.py",
        "import triton\n\n@triton.jit\ndef k(a, b, c, d, e, f, g, h, i, j):\n    pass\n",
    )
    _write(
        tmp_path,
        "agentctx/c.py",
        "import click\n\n@click.command()\ndef c(a, b, c, d, e, f, g, h, i):\n    pass\n",
    )
    _write(tmp_path, "agentctx/env.py", "import os\n\nX = os.environ.get('HOME')\n")  # app may
    assert breaches(tmp_path) == []


def test_the_repository_keeps_the_rules():
    root = Path(__file__).resolve().parents[2]
    assert breaches(root) == []
