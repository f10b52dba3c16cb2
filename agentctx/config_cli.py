"""`agentctx config path|show`: where config.json is, and what it sets (the default model,
aliases, named backends, sampling settings, the KV snapshot budget), with the default model
and the sampling settings in effect."""

from __future__ import annotations

import json

import click

from agentctx.command import run


@click.group()
def config() -> None:
    """Where the config file is and what it sets."""


@config.command("path")
def config_path_cmd() -> None:
    """Print the config file's path (it need not exist yet)."""
    from agentctx.models import config_path

    click.echo(str(config_path()))


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="Only the file's settings, as JSON.")
def config_show(as_json: bool) -> None:
    """Print the config file's settings (and, without --json, its path, the default model
    and the sampling settings in effect)."""
    from agentctx.models import config_path, default_model, load_config
    from agentctx.sampling_settings import describe_values, in_effect

    settings = run(load_config)  # a file that cannot be read: one line, exit 1
    if as_json:
        click.echo(json.dumps(settings, indent=2, sort_keys=True))
        return
    path = config_path()
    click.echo(f"# {path}" + ("" if path.is_file() else " (no such file: the defaults apply)"))
    click.echo(f"# default model in effect: {default_model(settings)}")
    click.echo(f"# sampling in effect: {describe_values(in_effect(settings.get('sampling')))}")
    click.echo(json.dumps(settings, indent=2, sort_keys=True))
