from __future__ import annotations

import os

# Without a GPU, Triton kernels run in the interpreter so tests can compare them with their
# torch references. This must be set before triton is first imported.
if not os.environ.get("CUDA_VISIBLE_DEVICES") and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def agentctx_home(tmp_path_factory):
    """Every test, and every subprocess it starts, uses a private AGENTCTX_HOME.

    It is shared by the session so the default model's GGUF is converted once."""
    home = tmp_path_factory.mktemp("agentctx_home")
    old = os.environ.get("AGENTCTX_HOME")
    os.environ["AGENTCTX_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("AGENTCTX_HOME", None)
    else:
        os.environ["AGENTCTX_HOME"] = old
