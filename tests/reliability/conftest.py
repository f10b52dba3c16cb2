"""Fixtures of the reliability matrix."""

from __future__ import annotations

# A fresh AGENTCTX_HOME per test, with the suite's model cache and config.json (its default
# model, SmolLM2): what the CLI tests use.
from tests.app.test_sessions_cli import home  # noqa: F401
