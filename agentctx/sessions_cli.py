"""`agentctx sessions ...`: list, show, rename, delete, export and import stored sessions."""

from __future__ import annotations

import json
import os
import sys

import click

from agentctx.command import UserError, open_store, run


@click.group()
def sessions() -> None:
    """List, show, rename, delete, export and import stored sessions."""


def _session_dict(s) -> dict:
    return {
        "id": s.id, "name": s.name, "root": s.root, "root_kind": s.root_kind, "model": s.model,
        "created": s.created, "updated": s.updated, "messages": s.message_count,
        "turns": s.turns, "title": s.label or None,
    }  # fmt: skip


@sessions.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.option("-n", "--limit", type=click.IntRange(1), default=None)
@click.option("--search", default=None, metavar="TEXT",
              help="Only sessions whose title or name holds TEXT, or whose questions and "
              "answers have all its words.")  # fmt: skip
def sessions_list(as_json: bool, limit: int | None, search: str | None) -> None:
    """Sessions, most recent first."""
    if limit is not None:
        limit = min(limit, 1 << 62)  # (SQLite's integers are 64-bit)
    rows = run(lambda: open_store().list(limit=limit, search=search))
    if as_json:
        click.echo(json.dumps([_session_dict(s) for s in rows], indent=2))
        return
    for s in rows:  # as the TUI's list: what it is, what it reads, model, turns, last use
        name = f" ({s.name})" if s.name else ""
        title = s.label if len(s.label) <= 60 else s.label[:59] + "…"
        turns = f"{s.turns} turn" + ("" if s.turns == 1 else "s")
        reads = f"book: {s.root}" if s.root_kind == "book" else s.root
        click.echo(f"{s.id}{name}  {title}  {reads}  {s.model}  {turns}  {s.updated[:19]}")


@sessions.command("show")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
def sessions_show(ref: str, as_json: bool) -> None:
    """One session and its messages."""

    def show():
        store = open_store()
        s = store.get(ref)
        return s, store.messages(s.id), store.manifests(s.id)

    s, msgs, manifests = run(show)
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
    s = run(lambda: open_store().rename(ref, name))
    click.echo(f"renamed {s.id} to {s.name}")


@sessions.command("rm")
@click.argument("ref")
def sessions_rm(ref: str) -> None:
    """Delete a session and everything stored with it."""
    from agentctx import kv_snapshots

    s = run(lambda: open_store().delete(ref))
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
@click.option("--format", "fmt", type=click.Choice(["jsonl", "markdown"]), default="jsonl",
              show_default=True,
              help="jsonl: the file `sessions import` reads back; markdown: a transcript.")  # fmt: skip
def sessions_export(ref: str, path: str | None, with_kv: bool, fmt: str) -> None:
    """Write a session as a JSON Lines file or a Markdown transcript (stdout without -o)."""
    from agentctx import kv_snapshots
    from sessions.markdown import write_markdown
    from sessions.session_file import export_session

    if with_kv and fmt != "jsonl":
        raise click.UsageError("--with-kv is for --format jsonl")

    def kv_of(store):
        if not with_kv:
            return None
        kv = kv_snapshots.kv_path(store.get(ref).id)
        if not kv.exists():
            raise UserError(f"session {ref} has no KV snapshot; ask a question in it first")
        return kv

    def export_session_as(store, fp, kv) -> None:
        if fmt == "markdown":
            write_markdown(store, ref, fp)
        else:
            export_session(store, ref, fp, kv)

    if path is None:

        def to_stdout():
            store = open_store()
            with store.snapshot():  # messages and tool calls of one moment
                export_session_as(store, sys.stdout, kv_of(store))

        run(to_stdout)
        return
    import tempfile

    target = _export_target(path)

    def export():
        store = open_store()
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
            # (store.snapshot: messages and tool calls of one moment)
            with os.fdopen(fd, "w", encoding="utf-8") as fp, store.snapshot():
                export_session_as(store, fp, kv)
            os.chmod(tmp, mode)
            os.replace(tmp, target)  # never a half-written file at `path`
        except OSError as e:
            os.unlink(tmp)
            raise UserError(f"cannot write {path}: {e.strerror or e}") from None
        except BaseException:
            os.unlink(tmp)
            raise

    run(export)
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
        return import_session(open_store(), path, kv_snapshots.kv_dir())

    s = run(do_import)
    click.echo(f"imported {s.id}")
