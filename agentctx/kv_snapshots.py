"""Where the app keeps KV snapshots, and how many bytes of them.

One file per stored session, `<session id>.kv`, in a `kv/` folder beside the session
database. Saving one prunes the folder to the disk budget, least recently used first
(a snapshot is "used" when it is saved or loaded; its mtime records that). The budget comes
from $AGENTCTX_KV_BUDGET, else "kv_budget" in config.json, else 4 GiB; "0" keeps none.
Temporary files (`.<name>.<pid>.tmp`, a snapshot being written or imported) count against
the budget while their writer lives, and are deleted once it is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from sessions.paths import home_dir

DEFAULT_BUDGET = 4 << 30
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6,
          "mib": 1 << 20, "g": 1e9, "gb": 1e9, "gib": 1 << 30, "t": 1e12, "tb": 1e12,
          "tib": 1 << 40}  # fmt: skip


class BudgetError(ValueError):
    pass


_MAX_SIZE = float(1 << 60)  # no machine has an exbibyte of memory or disk


def parse_size(text: str | int) -> int:
    """Bytes from "4GiB", "500 MB", "1e9" or an int."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise BudgetError(f"a size cannot be negative: {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise BudgetError(f"not a size: {text!r} (use e.g. 4GiB, 500MB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not value < _MAX_SIZE:  # (1e999 is inf)
        raise BudgetError(f"not a size: {text!r} is more than 1 EiB")
    return int(value)


def kv_dir() -> Path:
    return home_dir() / "kv"


def kv_path(session_id: str) -> Path:
    """The snapshot file of a session. An id not of the store's form (one imported before
    imports were checked, "../x" say) is refused: it would name a file outside kv/."""
    from sessions.errors import StoreError
    from sessions.store import is_session_id

    if not is_session_id(session_id):
        raise StoreError(f"session id {session_id!r} is not of the form s-xxxxxx")
    return kv_dir() / f"{session_id}.kv"


def budget() -> int:
    env = os.environ.get("AGENTCTX_KV_BUDGET")
    if env:
        return parse_size(env)
    from agentctx.models import load_config

    value = load_config().get("kv_budget")
    return DEFAULT_BUDGET if value is None else parse_size(value)


def touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)


def prune(directory: Path, limit: int) -> list[Path]:
    """Delete the least recently used snapshots until the rest fit in `limit` bytes;
    returns what was deleted (the newest too, if it alone is over the limit). Temporary
    files left by a writer that was killed (its pid gone) are deleted first; those of a
    live writer count against the limit, as the snapshot they become will."""
    from engine.kv.snapshot_header import remove_stale_temps, temp_files

    removed = remove_stale_temps(directory)
    files, total = [], 0
    for p in directory.glob("*.kv"):
        try:
            st = p.stat()
        except OSError:
            continue
        files.append((st.st_mtime, p, st.st_size))
    for p, _ in temp_files(directory):
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    files.sort()
    total += sum(size for _, _, size in files)
    for _, p, size in files:
        if total <= limit:
            break
        p.unlink(missing_ok=True)
        total -= size
        removed.append(p)
    return removed


def remove(session_id: str) -> None:
    from sessions.store import is_session_id

    if is_session_id(session_id):  # (no other id has a snapshot of ours: see kv_path)
        kv_path(session_id).unlink(missing_ok=True)
