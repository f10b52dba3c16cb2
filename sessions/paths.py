"""Where the session database lives."""

from __future__ import annotations

import os
from pathlib import Path


def home_dir() -> Path:
    """$AGENTCTX_HOME, else $XDG_DATA_HOME/agentctx, else ~/.local/share/agentctx."""
    home = os.environ.get("AGENTCTX_HOME")
    if home:
        return Path(home).expanduser()
    data = os.environ.get("XDG_DATA_HOME")
    if data:
        return Path(data).expanduser() / "agentctx"
    return Path.home() / ".local" / "share" / "agentctx"


def db_path() -> Path:
    return home_dir() / "sessions.db"
