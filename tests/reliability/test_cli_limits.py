"""The CLI's own limits: a KV budget of 0 bytes is refused before any model loads (it was
accepted silently and meant "size it from the window"), and a turn writes nothing outside
AGENTCTX_HOME and the model cache: not torch's torchinductor_<user> folder in the system
temp directory (made when torch._dynamo is first imported), not ~/.triton."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.reliability.session_file_support import private_home
from tests.reliability.support import make_repo


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "greeter", {"README.md": "# greeter\n\nSays hello.\n"})


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentctx", *args], capture_output=True,
                          text=True, timeout=600, env=env)  # fmt: skip


@pytest.mark.parametrize("options", [
    ["--host-kv-budget", "0"], ["--host-kv-budget", "0GiB"], ["--host-kv-budget", "0.4"],
    ["--sparse", "2%", "--gpu-kv-budget", "0"],
])  # fmt: skip
def test_a_kv_budget_of_zero_bytes_is_refused_in_one_line(repo, options):
    proc = run("ask", "What is this?", "--repo", str(repo), *options)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "loading model" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "holds no KV" in line]
    assert len(errors) == 1 and options[-2] in errors[0], proc.stderr


@pytest.mark.slow
def test_a_turn_writes_nothing_in_the_temp_dir_or_home(repo, tmp_path):
    home = private_home(tmp_path)
    temp, user_home = tmp_path / "tmp", tmp_path / "user"
    temp.mkdir()
    user_home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}  # fmt: skip
    env.update(TMPDIR=str(temp), TEMP=str(temp), TMP=str(temp), HOME=str(user_home),
               AGENTCTX_HOME=str(home))  # fmt: skip
    proc = run("ask", "What is this?", "--repo", str(repo), "--max-tokens", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(temp)) == [] and sorted(os.listdir(user_home)) == []
    assert (home / "cache" / "torchinductor").is_dir()  # where it went instead
