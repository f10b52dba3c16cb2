"""`agentctx tui`: the chat TUI on a repository, over the embedded engine or (--backend) an
OpenAI-compatible server."""

from __future__ import annotations

import click

from agentctx.command import open_store, run
from agentctx.engine_options import engine_config, kv_options


@click.command()
@click.option("--repo", "repo", default=".", show_default=True, help="Repository to read.")
@click.option(
    "--model",
    "model",
    default=None,
    help="A known model's name or alias (agentctx models), a .gguf file, a checkpoint "
    "directory or a cached repo id.",
)
@click.option("--backend", default=None, metavar="URL|NAME",
              help="Run the turns on an OpenAI-compatible server (as for ask --backend).")  # fmt: skip
@click.option("--api-key-env", default=None, metavar="VAR",
              help="The backend's API key is in $VAR.")  # fmt: skip
@kv_options
def tui(repo: str, model: str | None, backend, api_key_env, sparse, gpu_kv_budget, host_kv_budget,
        forecast, prefetch, speculate) -> None:  # fmt: skip
    """Open the chat TUI."""
    from agentctx.tui import run_tui
    from tools.repo_files import resolve_root

    if not repo.strip():
        raise click.UsageError("--repo takes a path, not an empty string")
    if api_key_env is not None and backend is None:
        raise click.UsageError("--api-key-env is for a --backend")
    config = engine_config(sparse, gpu_kv_budget, host_kv_budget, forecast, speculate, prefetch)
    root = run(lambda: str(resolve_root(repo)))
    open_store().close()  # a store that cannot be opened: one line here, not a traceback in the app
    if backend is not None:
        from agentctx.remote.backend_config import backend_spec

        spec = run(lambda: backend_spec(backend, model, api_key_env))  # a bad name: one line
        from agentctx.remote.backend import connect_backend

        run_tui(repo=root, model=spec.model,
                connect=lambda: connect_backend(backend, model, api_key_env))  # fmt: skip
        return
    from agentctx.models import resolve_model

    run_tui(repo=root, model=run(lambda: resolve_model(model)), config=config)
