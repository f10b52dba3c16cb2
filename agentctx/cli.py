"""The `agentctx` command line. Errors are one line on stderr; exit 0 ok, 1 error, 2 usage,
130 interrupted."""

from __future__ import annotations

import sys

import click


class UserError(click.ClickException):
    exit_code = 1

    def show(self, file=None) -> None:
        click.echo(f"agentctx: error: {self.message}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agentctx")
def cli() -> None:
    """agentctx: ask questions about a whole repository with a local model."""


@cli.command()
@click.argument("question")
@click.option("--repo", "repo", default=".", show_default=True, help="Repository to read.")
@click.option(
    "--model",
    "model",
    default=None,
    help="A .gguf file, a checkpoint directory or a cached repo id.",
)
@click.option(
    "--max-tokens", default=400, show_default=True, type=click.IntRange(1), help="Longest answer."
)
@click.option(
    "--temperature", default=0.0, show_default=True, type=click.FloatRange(0), help="0 is greedy."
)
@click.option(
    "--context-tokens",
    default=None,
    type=click.IntRange(1),
    help="Cap on packed repository tokens.",
)
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option(
    "--weights",
    type=click.Choice(["auto", "dense", "int4"]),
    default="auto",
    show_default=True,
    help="int4: the GGUF's 4-bit blocks on the CPU (fast); dense: the exact reference.",
)
def ask(question, repo, model, max_tokens, temperature, context_tokens, device, weights) -> None:
    """Answer QUESTION about the repository at --repo."""
    from agentctx.ask import ask as run_ask
    from engine import Engine, EngineError, SamplingParams
    from tools.errors import ToolError
    from tools.repo_files import resolve_root

    try:
        root = resolve_root(repo)
        click.echo("loading model...", err=True)
        engine = Engine.load(model, device=device, weights=weights)
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
        run_ask(engine, str(root), question, params, context_tokens)
    except (EngineError, ToolError) as e:
        raise UserError(str(e)) from None


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    sys.exit(0)
