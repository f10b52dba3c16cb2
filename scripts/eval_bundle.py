"""Build .whl/eval/: what `python -m bench.answer_eval` and `agentctx serve` need on the GPU machine (python 3.12,
torch, triton, transformers, tokenizers, safetensors, numpy; no network) that its python lacks.

- wheels of the third-party modules the evaluation imports there, at this venv's versions
  (pure-Python ones, and cp312 manylinux x86_64 ones for the compiled ones), downloaded with
  `pip download --no-deps`;
- PyYAML as its pure-Python sources and a .dist-info (py/PyYAML/, a quarter of its compiled
  wheel: gguf imports yaml, transformers checks pyyaml's version; the C loader is optional);
- this python's standard-library `json` package (src/json/, .py files only): the question set's
  json repository is the 3.11 one, and the device's own json is 3.12's, so the evaluation runs
  there with `--package-dir json=.whl/eval/src/json`;
- MANIFEST: one line per item, `MODULE WHEN PATH`, read by bench/gpu_answer_eval.sh. WHEN is
  `always` for the question set's own repositories (click, pathspec: their versions are
  checked) and `missing` for the rest (installed only where the device's python lacks them,
  so nothing that torch or transformers import is shadowed).

Run with the venv's python (the versions are read from it): .venv/bin/python scripts/eval_bundle.py
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (distribution, the module it provides, when the device installs it)
WHEELS = [
    ("click", "click", "always"),  # a question-set repository; also agentctx.engine_options
    ("pathspec", "pathspec", "always"),  # a question-set repository; also tools.grep
    ("gguf", "gguf", "missing"),  # converting the .gguf model
    ("regex", "regex", "missing"),  # tools.regex_guard (compiled: cp312)
    ("Jinja2", "jinja2", "missing"),  # transformers' apply_chat_template
    ("MarkupSafe", "markupsafe", "missing"),  # jinja2's (compiled: cp312)
    ("GitPython", "git", "missing"),  # tools.safe_git: the repository's file list, git tools
    ("gitdb", "gitdb", "missing"),
    ("smmap", "smmap", "missing"),
    # agentctx serve and bench.serve_load's clients (bench/gpu.sh serve)
    ("starlette", "starlette", "missing"),
    ("uvicorn", "uvicorn", "missing"),
    ("h11", "h11", "missing"),
    ("anyio", "anyio", "missing"),
    ("sniffio", "sniffio", "missing"),
    ("httpx", "httpx", "missing"),
    ("httpcore", "httpcore", "missing"),
    ("idna", "idna", "missing"),
    ("certifi", "certifi", "missing"),
    ("click-default-group", "click_default_group", "missing"),
]
SOURCES = [("PyYAML", "yaml", "missing")]  # .py files and a .dist-info, into py/DIST/
DEVICE_PYTHON = "3.12"


def target(python: str) -> list[str]:
    """pip download's options for wheels that install on CPython `python`, Linux x86_64."""
    abi = "cp" + python.replace(".", "")
    return ["--only-binary", ":all:", "--python-version", python, "--implementation", "cp",
            "--abi", abi, "--platform", "manylinux2014_x86_64",
            "--platform", "manylinux_2_28_x86_64"]  # fmt: skip


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"eval_bundle: {dist} is not installed in {sys.executable}; run the venv's python")


def copy_py(source: Path, target: Path) -> int:
    """The .py files of the package at source into target; returns how many."""
    files = [p for p in sorted(source.rglob("*.py")) if "__pycache__" not in p.parts]
    for path in files:
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    return len(files)


def build(out: Path, python: str = DEVICE_PYTHON) -> list[str]:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    pins = [f"{dist}=={version(dist)}" for dist, _, _ in WHEELS]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(out)]
    done = subprocess.run([*cmd, *target(python), *pins], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"eval_bundle: pip download failed:\n{done.stderr.strip()}")
    wheels = {p.name.split("-")[0].lower().replace("_", "-"): p.name for p in out.glob("*.whl")}
    manifest = []
    for dist, module, when in WHEELS:
        name = wheels.get(dist.lower().replace("_", "-"))
        if name is None or f"-{version(dist)}-" not in name:
            sys.exit(f"eval_bundle: no wheel of {dist}=={version(dist)} in {out}")
        manifest.append(f"{module} {when} {name}")
    for dist, module, when in SOURCES:
        version(dist)
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            sys.exit(f"eval_bundle: {module} ({dist}) is not an importable package")
        folder = out / "py" / dist
        copy_py(Path(list(spec.submodule_search_locations)[0]), folder / module)
        info = folder / f"{dist}-{version(dist)}.dist-info"
        info.mkdir()
        metadata = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version(dist)}\n"
        (info / "METADATA").write_text(metadata)
        (info / "top_level.txt").write_text(module + "\n")
        manifest.append(f"{module} {when} py/{dist}")
    src = Path(json.__file__).parent
    if copy_py(src, out / "src" / "json") == 0:
        sys.exit(f"eval_bundle: no .py files in {src}")
    (out / "src" / "VERSION").write_text(f"json from python {sys.version.split()[0]} ({src})\n")
    (out / "MANIFEST").write_text("".join(line + "\n" for line in manifest))
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".whl" / "eval")
    ap.add_argument("--python-version", default=DEVICE_PYTHON,
                    help="the python the compiled wheels are for (another: a local dry run)")  # fmt: skip
    args = ap.parse_args(argv)
    manifest = build(args.out, args.python_version)
    files = [p for p in sorted(args.out.rglob("*")) if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    for line in manifest:
        print(line)
    print(f"json sources of python {sys.version.split()[0]}: src/json")
    print(f"{args.out}: {len(files)} files, {total:,} bytes ({total / 2**20:.2f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
