"""The terminal UI: `run_tui()` opens a chat about a repository."""

from __future__ import annotations


def run_tui(repo: str | None = None, model: str | None = None) -> None:
    """Open the TUI; returns when the user quits."""
    from agentctx.tui.app import AgentApp

    AgentApp(repo=repo, model=model).run()
