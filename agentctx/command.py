"""What every `agentctx` command shares: errors as one `agentctx: error:` line (exit 1 for a
failure, 2 for a usage error), and opening the session store."""

from __future__ import annotations

import click

PROG = "agentctx"
LONGEST_ERROR = 400  # characters of an error line; a 5,000-character path is clipped


class UserError(click.ClickException):
    exit_code = 1

    def show(self, file=None) -> None:
        click.echo(error_line(self.message), err=True)


def error_line(message: str) -> str:
    """One line, however many the message has, and not a screenful: the middle of a long
    one (a huge path it quotes) is left out."""
    text = " ".join(message.split())
    if len(text) > LONGEST_ERROR:
        head, tail = LONGEST_ERROR * 2 // 3, LONGEST_ERROR // 4
        text = f"{text[:head]}...({len(text) - head - tail:,} characters)...{text[-tail:]}"
    return f"{PROG}: error: {text}"


def usage_error_line(e: click.UsageError) -> str:
    """click's Usage/Try/Error lines as one, naming where the help is."""
    where = e.ctx.command_path if e.ctx is not None else PROG
    return error_line(f"{e.format_message()} (see {where} --help)")


def errors() -> tuple[type[Exception], ...]:
    """The exception types that end a command with one line (imported lazily: startup speed)."""
    from engine import EngineError
    from sessions.errors import StoreError
    from tools.errors import ToolError

    return (EngineError, ToolError, StoreError)


def run(fn):
    """fn(), with the errors above as UserError."""
    try:
        return fn()
    except errors() as e:
        raise UserError(str(e)) from None


def open_store():
    from sessions.errors import StoreError
    from sessions.store import SessionStore

    try:
        return SessionStore()
    except StoreError as e:
        raise UserError(str(e)) from None
