"""Where the engine keeps files it can rebuild: converted checkpoints and the stamps of
checked model files. The application chooses the folder (agentctx.app_paths follows
AGENTCTX_HOME and XDG_CACHE_HOME) and passes it in, as EngineConfig.cache_dir; the engine
reads no environment variable."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """~/.cache/agentctx: the folder when the caller names none (not created)."""
    return Path.home() / ".cache" / "agentctx"


def cache_dir(given: str | os.PathLike | None = None) -> Path:
    """`given`, else default_cache_dir()."""
    return Path(given) if given is not None else default_cache_dir()
