"""The top-level command group: `agentctx "question"` is `agentctx ask "question"`, but a
lone word that names no command is refused as a mistyped command (did you mean...?), not
answered as a question; `agentctx` alone opens the TUI only on a terminal."""

from __future__ import annotations

import difflib
import re
import sys

import click
from click_default_group import DefaultGroup

WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


class CommandGroup(DefaultGroup):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if len(args) == 1 and WORD.fullmatch(args[0]) and args[0] not in self.commands:
            word = args[0]
            close = difflib.get_close_matches(word, sorted(self.commands), n=1, cutoff=0.6)
            hint = (f"did you mean '{close[0]}'?" if close
                    else f'to ask it, use: agentctx ask "{word}"')  # fmt: skip
            raise click.UsageError(f"unknown command '{word}' ({hint})", ctx)
        return super().parse_args(ctx, args)


def require_terminal(ctx: click.Context) -> None:
    """The TUI needs a terminal: elsewhere (a pipe, a file) one line of usage, exit 2."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        click.echo("agentctx: error: the TUI needs a terminal; usage: agentctx ask \"QUESTION\" "
                   "[--repo PATH], or agentctx --help for the commands", err=True)  # fmt: skip
        sys.exit(2)
