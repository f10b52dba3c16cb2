"""The errors a TUI action reports as a line (the store, the engine, a tool), not a crash."""

from __future__ import annotations


def user_errors() -> tuple[type[Exception], ...]:
    from engine import EngineError
    from sessions.errors import StoreError
    from tools.errors import ToolError

    return (EngineError, ToolError, StoreError)
