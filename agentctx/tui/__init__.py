"""The terminal UI: `run_tui()` opens a chat about a repository."""

from __future__ import annotations


def run_tui(repo: str | None = None, model: str | None = None, config=None,
            connect=None, kind: str = "repo", resume: str | None = None) -> None:  # fmt: skip
    """Open the TUI; returns when the user quits. `config`: the engine's EngineConfig;
    `connect`: returns the remote backend the turns run on instead (agentctx.remote);
    `kind`: what `repo` is ("repo" or "book"); `resume`: a session id to open on start."""
    from agentctx.tui.app import AgentApp

    def load(name: str | None):
        from engine import Engine

        return Engine.load(name, config=config)

    AgentApp(repo=repo, model=model, engine_factory=load, connect=connect, kind=kind,
             resume=resume).run()  # fmt: skip
