"""`agentctx ask --dry-run` in a real process with the real default test model's tokenizer:
the packing report and the prompt's size, no answer, nothing stored; counted as the engine
counts (engine.runtime.prompt_tokens against Engine.chat_tokens)."""

from __future__ import annotations

import os

from agentctx.ask import new_session_messages
from engine import Engine, SamplingParams
from engine.runtime.prompt_tokens import PromptTokens
from sessions.store import SessionStore
from tests.app.test_cli import agentctx


class Quiet:
    def info(self, line: str) -> None:
        pass


def test_a_dry_run_reports_and_stores_nothing(repo):
    home = os.environ["AGENTCTX_HOME"]
    before = SessionStore().list()
    out = agentctx("ask", "What does add do?", "--repo", str(repo), "--model", "smollm2-135m",
                   "--dry-run", env={"AGENTCTX_HOME": home})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and "loading model" not in out.stderr
    assert "calc.py" in out.stderr  # the packing report
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("dry run: ") and "-token window" in last
    assert "nothing was generated or stored" in last
    assert SessionStore().list() == before


def test_the_tokenizer_alone_counts_as_the_engine_does(repo):
    engine = Engine.load("smollm2-135m", device="cpu")
    view = PromptTokens.load("smollm2-135m")
    assert view.max_model_len == engine.max_model_len
    params = SamplingParams(max_tokens=64)
    ours, _ = new_session_messages(view, str(repo), "What does add do?", params, None, Quiet())
    theirs, _ = new_session_messages(engine, str(repo), "What does add do?", params, None, Quiet())
    assert ours == theirs
    assert view.chat_tokens(ours) == engine.chat_tokens(ours)


def test_rope_scaling_stretches_the_window_that_packing_fills(repo):
    """--rope-scaling yarn:2 doubles SmolLM2's 8K window for the packing, as the engine's
    window (EngineConfig.rope_scaling); a bad value or a second scaling is one line."""
    from agentctx.engine_options import engine_config

    home = {"AGENTCTX_HOME": os.environ["AGENTCTX_HOME"]}
    args = ("ask", "What does add do?", "--repo", str(repo), "--model", "smollm2-135m", "--dry-run")
    plain = agentctx(*args, env=home)
    stretched = agentctx(*args, "--rope-scaling", "yarn:2", env=home)
    assert plain.returncode == stretched.returncode == 0, stretched.stderr
    assert "of the 8,192-token window" in plain.stderr.splitlines()[-1]
    assert "of the 16,384-token window" in stretched.stderr.splitlines()[-1]
    view = PromptTokens.load("smollm2-135m", engine_config(None, None, None, rope_scaling="yarn:2"))
    assert view.max_model_len == 16384
    for bad in ("yarn", "yarn:1", "dynamic:2", "yarn:x"):
        out = agentctx(*args, "--rope-scaling", bad, env=home)
        assert out.returncode == 2 and "--rope-scaling" in out.stderr, bad
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, bad
