"""The models agentctx can find locally: the default model, Hugging Face cache snapshots of
supported architectures, and .gguf files listed in the config file."""

from __future__ import annotations

import json
import os
from pathlib import Path

SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def config_path() -> Path:
    """$AGENTCTX_HOME/config.json, else $XDG_CONFIG_HOME/agentctx/config.json."""
    home = os.environ.get("AGENTCTX_HOME")
    if home:
        return Path(home) / "config.json"
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "agentctx" / "config.json"


def load_config() -> dict:
    path = config_path()
    if not path.is_file():
        return {}
    from tools.errors import ToolError

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # (UnicodeDecodeError: a ValueError)
        raise ToolError(f"cannot read config {path}: {e}") from None
    if not isinstance(data, dict):
        raise ToolError(f"bad config {path}: not a JSON object")
    if not isinstance(data.get("models", []), list):
        raise ToolError(f'bad config {path}: "models" must be a list')
    return data


def _hf_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    hf_home = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
    return Path(hf_home) / "hub"


def find_models() -> list[dict]:
    from engine.default_model import DEFAULT_MODEL_NAME, default_model_path
    from engine.errors import ModelNotFoundError

    found = []
    try:
        found.append(
            {
                "name": "default",
                "kind": "gguf",
                "path": str(default_model_path()),
                "note": DEFAULT_MODEL_NAME,
            }
        )
    except ModelNotFoundError as e:
        found.append({"name": "default", "kind": "missing", "path": "", "note": str(e)})
    for snapshot_config in sorted(_hf_cache().glob("models--*/snapshots/*/config.json")):
        try:
            arch = (json.loads(snapshot_config.read_text()).get("architectures") or [""])[0]
        except (OSError, json.JSONDecodeError):
            continue
        if arch in SUPPORTED and any(snapshot_config.parent.glob("*.safetensors")):
            repo = snapshot_config.parents[2].name.removeprefix("models--").replace("--", "/")
            found.append(
                {
                    "name": repo,
                    "kind": "hf-cache",
                    "path": str(snapshot_config.parent),
                    "note": arch,
                }
            )
    for entry in load_config().get("models", []):
        path = Path(str(entry)).expanduser()
        kind = "gguf" if path.suffix == ".gguf" else "checkpoint"
        note = "" if path.exists() else "missing"
        found.append({"name": path.stem, "kind": kind, "path": str(path), "note": note})
    return found
