"""`agentctx config path|show` in real processes over a private AGENTCTX_HOME: where the
file is, what it sets, and one error line for a file that cannot be read."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def agentctx(home, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTCTX_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "agentctx", *args], capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip


def test_config_path_and_show(tmp_path):
    home = tmp_path / "home"
    assert agentctx(home, "config", "path").stdout == f"{home / 'config.json'}\n"
    empty = agentctx(home, "config", "show")
    assert empty.returncode == 0 and "(no such file: the defaults apply)" in empty.stdout
    assert json.loads(agentctx(home, "config", "show", "--json").stdout) == {}
    home.mkdir()
    settings = {"default_model": "qwen2.5-coder-1.5b", "aliases": {"q": "qwen2.5-coder-0.5b"},
                "backends": {"cluster": {"url": "http://gpu1:8000/v1"}}}  # fmt: skip
    (home / "config.json").write_text(json.dumps(settings))
    shown = agentctx(home, "config", "show")
    assert "# default model in effect: qwen2.5-coder-1.5b" in shown.stdout
    assert json.loads(agentctx(home, "config", "show", "--json").stdout) == settings


def test_a_config_that_cannot_be_read_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    out = agentctx(tmp_path, "config", "show")
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("agentctx: error: cannot read config ")
