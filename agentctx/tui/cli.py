"""`agentctx tui`: the chat TUI on a repository, over the embedded engine or (--backend) an
OpenAI-compatible server."""

from __future__ import annotations

import click

from agentctx.command import UserError, open_store, run
from agentctx.engine_options import engine_config, kv_options


@click.command()
@click.option("--repo", "repo", default=".", show_default=True, help="Repository to read.")
@click.option("--book", default=None, metavar="FILE", help="A book (a text file) to read instead.")
@click.option(
    "--model",
    "model",
    default=None,
    help="A known model's name or alias (agentctx models), a .gguf file, a checkpoint "
    "directory or a cached repo id.",
)
@click.option("-c", "--continue", "cont", is_flag=True, help="Resume the most recent session.")
@click.option("--session", "session_ref", default=None, metavar="ID|NAME",
              help="Resume this session (its KV is restored with the next question).")  # fmt: skip
@click.option("--backend", default=None, metavar="URL|NAME",
              help="Run the turns on an OpenAI-compatible server (as for ask --backend).")  # fmt: skip
@click.option("--api-key-env", default=None, metavar="VAR",
              help="The backend's API key is in $VAR.")  # fmt: skip
@kv_options
def tui(repo: str, book: str | None, model: str | None, cont: bool, session_ref: str | None,
        backend, api_key_env, sparse, gpu_kv_budget, host_kv_budget, forecast, prefetch,
        speculate, rope_scaling, kv_dtype) -> None:  # fmt: skip
    """Open the chat TUI."""
    from agentctx.tui import run_tui

    if not repo.strip() or book is not None and not book.strip():
        raise click.UsageError("--repo and --book take a path, not an empty string")
    if cont and session_ref:
        raise click.UsageError("use either --session or -c/--continue, not both")
    if api_key_env is not None and backend is None:
        raise click.UsageError("--api-key-env is for a --backend")
    config = engine_config(
        sparse, gpu_kv_budget, host_kv_budget, forecast, speculate, prefetch, rope_scaling, kv_dtype
    )
    from agentctx.models import load_config

    run(load_config)  # a bad config.json (its "sampling" too): one line, before the TUI starts
    root, kind = run(lambda: _root(repo, book))
    resume = run(lambda: _session_to_resume(cont, session_ref))
    extra = {"kind": kind, "resume": resume}
    if backend is not None:
        from agentctx.remote.backend_config import backend_spec

        spec = run(lambda: backend_spec(backend, model, api_key_env))  # a bad name: one line
        from agentctx.remote.backend import connect_backend

        run_tui(repo=root, model=spec.model,
                connect=lambda: connect_backend(backend, model, api_key_env), **extra)  # fmt: skip
        return
    from agentctx.models import resolve_model

    run_tui(repo=root, model=run(lambda: resolve_model(model)), config=config, **extra)


def _root(repo: str, book: str | None) -> tuple[str, str]:
    """What new sessions read: the book (checked readable now, before the model loads) or
    the repository."""
    import os

    from tools.repo_files import resolve_root

    if book is not None:
        from tools.book import book_lines

        book_lines(book)  # a missing, binary or empty book fails here
        return os.path.realpath(book), "book"
    return str(resolve_root(repo)), "repo"


def _session_to_resume(cont: bool, ref: str | None) -> str | None:
    """The id of the session -c or --session names (checked now: one line, not an error
    inside the app), or None; the store is opened either way, so one that cannot be is one
    line here too."""
    store = open_store()
    try:
        if cont:
            latest = store.latest()
            if latest is None:
                raise UserError("there is no session to continue; start one without -c")
            return latest.id
        return store.get(ref).id if ref is not None else None
    finally:
        store.close()
