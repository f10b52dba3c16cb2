"""Where the engine keeps files it can rebuild: converted checkpoints and the like."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$AGENTCTX_HOME/cache, else $XDG_CACHE_HOME/agentctx, else ~/.cache/agentctx (not created)."""
    # Hand-rolled, not platformdirs: the engine must import with torch and transformers alone.
    home = os.environ.get("AGENTCTX_HOME")
    if home:
        return Path(home).expanduser() / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "agentctx"
    return Path.home() / ".cache" / "agentctx"
