"""`agentctx serve`: the OpenAI-compatible server over the embedded engine, run by uvicorn.
It binds 127.0.0.1 unless told otherwise; SIGTERM stops admitting, lets running requests
finish (or cancels them after --shutdown-timeout) and exits 0."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket

import click

from agentctx.command import UserError, run
from agentctx.engine_options import engine_config, kv_options


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free one).")  # fmt: skip
@click.option("--model", "model", default=None,
              help="A known model's name or alias (agentctx models), a .gguf file, a checkpoint "
              "directory or a cached repo id.")  # fmt: skip
@click.option("--api-key-env", default=None, metavar="VAR",
              help="Require `Authorization: Bearer $VAR` on every request.")  # fmt: skip
@click.option("--max-body", default="8MiB", show_default=True, help="Largest request body.")
@click.option("--shutdown-timeout", default=10.0, show_default=True, type=click.FloatRange(0),
              help="Seconds SIGTERM waits for running requests before cancelling them.")  # fmt: skip
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option("--weights", type=click.Choice(["auto", "dense", "int4", "int4-all"]), default="auto",
              show_default=True, help="As for `agentctx ask`.")  # fmt: skip
@kv_options
def serve(host, port, model, api_key_env, max_body, shutdown_timeout, device, weights, sparse,
          gpu_kv_budget, host_kv_budget, forecast, prefetch, speculate,
        rope_scaling, kv_dtype) -> None:  # fmt: skip
    """Serve the model over OpenAI's HTTP API (/v1/chat/completions, /v1/completions,
    /v1/models, /health)."""
    from agentctx.kv_snapshots import BudgetError, parse_size

    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env, "")
        if not key:
            raise click.BadParameter(f"${api_key_env} is not set or empty",
                                     param_hint="--api-key-env")  # fmt: skip
    try:
        body_limit = parse_size(max_body)
    except BudgetError as e:
        raise click.BadParameter(str(e), param_hint="--max-body") from None
    config = engine_config(
        sparse, gpu_kv_budget, host_kv_budget, forecast, speculate, prefetch, rope_scaling, kv_dtype
    )
    sock = _bind(host, port)
    if not _loopback(host):
        click.echo(f"agentctx serve: warning: {host} is not a loopback address; other machines "
                   "can reach this server" + ("" if key else " (and no --api-key-env is set)"),
                   err=True)  # fmt: skip
    from agentctx.models import resolve_model

    name = run(lambda: resolve_model(model))
    from agentctx.serve.app import create_app
    from agentctx.serve.engine_process import EngineSpec
    from agentctx.serve.runner import EngineRunner

    # the engine runs in its own process (agentctx.serve.engine_process says why)
    runner = EngineRunner(EngineSpec(name, device, weights, config))
    runner.start()
    facts = run(runner.loaded)
    app = create_app(runner, model or name, key, body_limit, shutdown_timeout)
    where = sock.getsockname()
    click.echo(f"agentctx serve: {model or name} on http://{_url_host(where[0])}:{where[1]}/v1 "
               f"(window {facts.max_model_len:,} tokens)", err=True)  # fmt: skip
    _run(app, sock, shutdown_timeout)


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads (a port in use fails at once)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _run(app, sock: socket.socket, shutdown_timeout: float) -> None:
    import uvicorn

    runner = app.state.runner

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            runner.admitting = False  # new requests get 503 while running ones finish
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=shutdown_timeout,
                            lifespan="on")  # fmt: skip
    # uvicorn raises the signal it shut down for again once it is done: after SIGTERM, that
    # must find a handler that returns (exit 0), not the default one (killed by SIGTERM)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        Server(config).run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        runner.stop()  # (drained already, unless the server failed)
