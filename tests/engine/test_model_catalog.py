"""Known models: split GGUFs read in place, and the size and sha256 checks before use."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

from engine.errors import ModelLoadError, ModelNotFoundError  # noqa: E402
from engine.loading import model_catalog  # noqa: E402
from engine.loading.gguf_checkpoint import gguf_to_checkpoint  # noqa: E402
from engine.loading.gguf_parts import open_buffer, sha256_of  # noqa: E402
from tests.engine.test_gguf import _tiny_model, _write_gguf  # noqa: E402


def _split(src: Path, into: Path, sizes: list[int]) -> list[Path]:
    data, parts, pos = src.read_bytes(), [], 0
    into.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate([*sizes, len(data)], start=1):
        part = into / f"part{i:02d}.bin"
        part.write_bytes(data[pos : pos + n])
        parts.append(part)
        pos += n
        if pos >= len(data):
            break
    return parts


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    src = tmp_path / "tiny.gguf"
    _write_gguf(src, "qwen2", _tiny_model("qwen2", True), gguf.GGMLQuantizationType.Q8_0)
    return src


def test_a_split_file_reads_as_the_whole(tmp_path: Path, tiny: Path) -> None:
    # cuts inside the header and inside tensors
    parts = _split(tiny, tmp_path / "parts", [100, 777, 5000])
    assert len(parts) == 4
    buf = open_buffer(parts)
    assert bytes(buf) == tiny.read_bytes()
    assert sha256_of(parts) == hashlib.sha256(tiny.read_bytes()).hexdigest()


def test_a_split_gguf_converts_like_the_single_file(tmp_path: Path, tiny: Path) -> None:
    from safetensors.torch import load_file

    parts = _split(tiny, tmp_path / "parts", [64, 4096])
    whole = gguf_to_checkpoint(tiny, cache_root=tmp_path / "c1")
    split = gguf_to_checkpoint(parts, cache_root=tmp_path / "c2", name="tiny-split")
    assert split.name.startswith("tiny-split-")
    a, b = load_file(whole / "model.safetensors"), load_file(split / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert (whole / "config.json").read_text() == (split / "config.json").read_text()
    # cached: a second call converts nothing
    assert gguf_to_checkpoint(parts, cache_root=tmp_path / "c2", name="tiny-split") == split


def _package(site: Path, module: str, files: dict[str, bytes]) -> None:
    (site / module / "data").mkdir(parents=True)
    (site / module / "__init__.py").write_text("")
    for name, data in files.items():
        (site / module / "data" / name).write_bytes(data)


@pytest.fixture
def fake_model(tmp_path: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch):
    """A known model whose two packages sit on sys.path, each with one slice of `tiny`."""
    data = tiny.read_bytes()
    site = tmp_path / "site"
    _package(site, "tinysplit_part1", {"part01.bin": data[:3000]})
    _package(site, "tinysplit_part2", {"part02.bin": data[3000:]})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))  # the engine's default cache: in here
    for name in ("tinysplit_part1", "tinysplit_part2"):
        sys.modules.pop(name, None)
    model = model_catalog.KnownModel(
        "tiny-split",
        "a tiny test model",
        "1K",
        len(data),
        hashlib.sha256(data).hexdigest(),
        64,
        True,
        ("tinysplit-part1", "tinysplit-part2"),
        "1.0",
    )
    monkeypatch.setitem(model_catalog.KNOWN, model.name, model)
    return model, site


def test_a_known_name_loads_from_its_parts(fake_model) -> None:
    from engine.loading.loader import resolve_source

    model, _ = fake_model
    assert model_catalog.is_installed(model)
    source = resolve_source("tiny-split")
    assert source.name == "tiny-split" and (source.path / "config.json").is_file()
    assert source.path.name.startswith("tiny-split-")
    assert source.path.parent == Path.home() / ".cache" / "agentctx" / "gguf"


def test_a_given_cache_dir_holds_the_checkpoint_and_the_stamp(fake_model, tmp_path) -> None:
    from engine.loading.loader import resolve_source

    source = resolve_source("tiny-split", tmp_path / "cache")
    assert source.path.parent == tmp_path / "cache" / "gguf"
    assert (tmp_path / "cache" / "models" / "tiny-split.verified.json").is_file()
    assert not (Path.home() / ".cache").exists()


def test_a_missing_package_is_not_found(fake_model) -> None:
    model, site = fake_model
    import shutil

    shutil.rmtree(site / "tinysplit_part2")
    assert not model_catalog.is_installed(model)
    with pytest.raises(ModelNotFoundError, match=r"tinysplit-part2 is missing\); run: agentctx"):
        model_catalog.verified_files(model)


def test_a_missing_part_file_is_not_found(fake_model) -> None:
    model, site = fake_model
    (site / "tinysplit_part1" / "data" / "part01.bin").unlink()
    with pytest.raises(ModelNotFoundError, match="tinysplit-part1 has no model file"):
        model_catalog.verified_files(model)


def test_a_truncated_part_is_refused(fake_model) -> None:
    model, site = fake_model
    part = site / "tinysplit_part2" / "data" / "part02.bin"
    part.write_bytes(part.read_bytes()[:-10])
    with pytest.raises(ModelLoadError, match="incomplete or damaged"):
        model_catalog.verified_files(model)


def test_a_wrong_hash_is_refused_even_after_a_good_check(fake_model) -> None:
    from engine.loading.loader import resolve_source

    model, site = fake_model
    model_catalog.verified_files(model)  # checked once: a stamp remembers it
    part = site / "tinysplit_part1" / "data" / "part01.bin"
    data = bytearray(part.read_bytes())
    data[-1] ^= 0xFF  # same size; the stamp no longer matches (mtime), so it is hashed again
    part.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="damaged: sha256"):
        model_catalog.verified_files(model)
    with pytest.raises(ModelLoadError, match="damaged: sha256"):
        resolve_source("tiny-split")  # never converted nor used
