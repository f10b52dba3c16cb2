"""Where agentctx keeps files it can rebuild, by the user's environment: the engine's cache
(converted checkpoints, model-check stamps) and the compilers' kernel caches."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$AGENTCTX_HOME/cache, else $XDG_CACHE_HOME/agentctx, else ~/.cache/agentctx (not created)."""
    # Hand-rolled, not platformdirs: bench/ computes the same folder without our dependencies.
    home = os.environ.get("AGENTCTX_HOME")
    if home:
        return Path(home).expanduser() / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "agentctx"
    return Path.home() / ".cache" / "agentctx"


def keep_compiler_caches_inside() -> None:
    """Point torch's inductor cache and Triton's kernel cache under cache_dir(), unless the
    user set them: by default the first is torchinductor_<user> in the system temp folder
    (made as soon as torch._dynamo is imported, which building a model on the meta device
    does) and the second ~/.triton. Both are read when first used, so this runs before the
    engine is imported (agentctx/__init__.py)."""
    base = cache_dir()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(base / "torchinductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(base / "triton"))
