"""A GGUF file stored as consecutive part files (`data/part01.bin`, `part02.bin`, ...).

Models shipped on PyPI as several packages keep one slice of the file in each. They are read
in place: the parts are never concatenated on disk. `open_buffer` gives one contiguous,
read-only view of the whole file for the GGUF reader: a memory map for a single file, and an
anonymous map filled from the parts for a split one (memory, not a second copy on disk; it
lives only while a conversion runs).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Callable, Sequence
from pathlib import Path

_READ = 8 << 20  # bytes per read when filling a map or hashing


def as_parts(source: str | os.PathLike | Sequence[str | os.PathLike]) -> tuple[Path, ...]:
    """One path, or the ordered parts of a split file, as a tuple of Paths."""
    if isinstance(source, (str, os.PathLike)):
        return (Path(source).expanduser(),)
    parts = tuple(Path(p).expanduser() for p in source)
    if not parts:
        raise ValueError("a split GGUF needs at least one part")
    return parts


def total_size(parts: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in parts)


def open_buffer(parts: Sequence[Path]) -> mmap.mmap:
    """The whole file as one read-only buffer. OSError or ValueError when a part is unreadable,
    empty, or changes size while it is read."""
    if len(parts) == 1:
        with open(parts[0], "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    size = total_size(parts)
    if size == 0:
        raise ValueError("the parts are empty")
    buf = mmap.mmap(-1, size)
    view = memoryview(buf)
    try:
        pos = 0
        for part in parts:
            with open(part, "rb") as f:
                while n := f.readinto(view[pos : pos + _READ]):
                    pos += n
        if pos != size:
            raise ValueError(f"the parts changed while they were read ({pos} of {size} bytes)")
    except BaseException:
        view.release()
        buf.close()
        raise
    view.release()
    return buf


def sha256_of(parts: Sequence[Path], progress: Callable[[int, int], None] | None = None) -> str:
    """sha256 of the parts concatenated in order; progress(done_bytes, total_bytes) after
    each read."""
    h = hashlib.sha256()
    total, done = total_size(parts), 0
    buf = bytearray(_READ)
    view = memoryview(buf)
    for part in parts:
        with open(part, "rb") as f:
            while n := f.readinto(view):
                h.update(view[:n])
                done += n
                if progress is not None:
                    progress(done, total)
    return h.hexdigest()


def stat_key(parts: Sequence[Path]) -> list[list]:
    """What identifies the parts' current contents cheaply: path, size, mtime and inode of
    each (a reinstall or an edit changes one of them)."""
    key = []
    for p in parts:
        st = p.stat()
        key.append([str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino])
    return key
