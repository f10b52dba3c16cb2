"""The application's cache folder follows the user's environment, and reaches the engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentctx import app_paths
from agentctx.engine_options import engine_config

REPO = Path(__file__).resolve().parents[2]


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert app_paths.cache_dir() == tmp_path / "home" / "cache"
    monkeypatch.delenv("AGENTCTX_HOME")
    assert app_paths.cache_dir() == tmp_path / "xdg" / "agentctx"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert app_paths.cache_dir() == Path.home() / ".cache" / "agentctx"


def test_every_engine_config_names_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path / "home"))
    assert engine_config(None, None, None).cache_dir == tmp_path / "home" / "cache"
    assert engine_config("2%", None, None).cache_dir == tmp_path / "home" / "cache"


def test_importing_agentctx_keeps_the_compiler_caches_inside(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}  # fmt: skip
    env["AGENTCTX_HOME"] = str(tmp_path / "home")
    show = "import agentctx, os; print(os.environ['TORCHINDUCTOR_CACHE_DIR']);" \
           "print(os.environ['TRITON_CACHE_DIR'])"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", show], env=env, cwd=REPO, text=True,
                         capture_output=True, check=True).stdout.split()  # fmt: skip
    assert out == [str(tmp_path / "home" / "cache" / "torchinductor"),
                   str(tmp_path / "home" / "cache" / "triton")]  # fmt: skip
    env["TRITON_CACHE_DIR"] = str(tmp_path / "mine")  # the user's own is kept
    out = subprocess.run([sys.executable, "-c", show], env=env, cwd=REPO, text=True,
                         capture_output=True, check=True).stdout.split()  # fmt: skip
    assert out[1] == str(tmp_path / "mine")
