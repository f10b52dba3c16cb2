"""Which server `--backend` names: a URL, or a backend of config.json's "backends":

    "backends": {"cluster": {"url": "http://gpu1:8000/v1", "urls": ["http://gpu2:8000/v1"],
                             "api_key_env": "CLUSTER_KEY", "model": "Qwen/Qwen2.5-Coder-7B",
                             "window": 32768, "tools": true}}

"url" and "urls" together are the replicas (at least one); "window" is for servers whose
/v1/models does not give it; "tools": false for a server that rejects the tools field.
--model and --api-key-env on the command line win over the config's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(slots=True)
class BackendSpec:
    name: str  # the config's name, or the URL given
    urls: list[str] = field(default_factory=list)
    model: str | None = None
    api_key_env: str | None = None
    window: int | None = None
    tools: bool | None = None  # None: found out from the server

    def api_key(self) -> str | None:
        """The key from $api_key_env; an unset or empty variable is an error, not no key."""
        from tools.errors import ToolError

        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env, "").strip()
        if not key:
            raise ToolError(f"${self.api_key_env} is not set or empty (--api-key-env)")
        return key


def is_url(ref: str) -> bool:
    return ref.startswith(("http://", "https://"))


def backend_spec(ref: str, model: str | None = None, api_key_env: str | None = None,
                 config: dict | None = None) -> BackendSpec:  # fmt: skip
    """The backend `--backend REF` names, with the command line's --model and --api-key-env."""
    from agentctx.models import config_path, load_config
    from tools.errors import ToolError

    ref = ref.strip()
    if is_url(ref):
        spec = BackendSpec(ref, [ref])
    else:
        config = load_config() if config is None else config
        backends = config.get("backends", {})
        if not isinstance(backends, dict) or ref not in backends:
            names = ", ".join(sorted(backends)) if isinstance(backends, dict) else ""
            raise ToolError(
                f"no backend named {ref!r} in {config_path()}"
                + (f" (it has: {names})" if names else "")
                + "; --backend takes a URL (http://HOST:PORT/v1) or a backend's name"
            )
        spec = _from_config(ref, backends[ref], config_path())
    spec.model = model or spec.model
    spec.api_key_env = api_key_env or spec.api_key_env
    return spec


def _from_config(name: str, entry, path) -> BackendSpec:
    from tools.errors import ToolError

    bad = lambda what: ToolError(f'bad config {path}: backend "{name}": {what}')
    if not isinstance(entry, dict):
        raise bad("must be an object")
    urls = ([entry["url"]] if "url" in entry else []) + list(entry.get("urls", []))
    if not urls or not all(isinstance(u, str) and is_url(u) for u in urls):
        raise bad('"url" and "urls" must give at least one http:// or https:// URL')
    for key in ("model", "api_key_env"):
        if not isinstance(entry.get(key, ""), str):
            raise bad(f'"{key}" must be a string')
    window = entry.get("window")
    if window is not None and (type(window) is not int or window < 1):
        raise bad('"window" must be a whole number of tokens')
    tools = entry.get("tools")
    if tools is not None and not isinstance(tools, bool):
        raise bad('"tools" must be true or false')
    return BackendSpec(name, urls, entry.get("model") or None, entry.get("api_key_env") or None,
                       window, tools)  # fmt: skip
