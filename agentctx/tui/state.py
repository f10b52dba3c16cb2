"""The one object the TUI stores sessions through (main thread only: the SQLite
connection belongs to the thread that opened it)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sessions.models import Message, Session


def question_of(content: str) -> str:
    """A first user message holds the packed repository or book; show only its question."""
    packed = content.startswith(("Repository files:", "Book chapters:"))
    if packed and "\n\nQuestion: " in content:
        return content.rsplit("\n\nQuestion: ", 1)[1]
    return content


class SessionService:
    def __init__(self, store):
        self.store = store

    def list(self) -> list[Session]:
        return self.store.list()

    def get(self, ref: str) -> Session:
        return self.store.get(ref)

    def messages(self, session_id: str) -> list[Message]:
        return self.store.messages(session_id)

    def tool_calls(self, session_id: str) -> list:
        return self.store.tool_calls(session_id)

    def history(self, session_id: str) -> list[dict]:
        """The turns to send again before a follow-up question (as `agentctx ask -c`)."""
        from agentctx.ask import history_messages

        return history_messages(self.store, session_id)

    def rename(self, ref: str, name: str | None) -> Session:
        return self.store.rename(ref, name)

    def delete(self, ref: str) -> Session:
        return self.store.delete(ref)

    def keep_settings(self, session_id: str, settings: dict) -> None:
        """Store a session's /set changes with it."""
        self.store.session_table.set_settings(session_id, settings)

    def export(self, ref: str, target: str | None = None) -> Path:
        """Write the session to `target`: a file (a .md name: a Markdown transcript, else
        JSON Lines), or a folder (default: the current one) where it is SESSION_ID.jsonl,
        which replaces only an earlier export."""
        from sessions.markdown import write_markdown
        from sessions.session_file import export_session

        given = Path(target).expanduser() if target else None
        if given is None or given.is_dir():
            path = (given or Path(os.getcwd())) / f"{self.store.get(ref).id}.jsonl"
            if path.is_symlink() or path.exists() and not _is_export(path):
                raise OSError(f"{path} exists and is not an earlier export: not replaced")
        else:
            path = given
            if not path.parent.is_dir():
                raise OSError(f"no folder {path.parent}")
        markdown = path.suffix.lower() in (".md", ".markdown")
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            # (store.snapshot: messages and tool calls of one moment)
            with open(tmp, "w", encoding="utf-8") as fp, self.store.snapshot():
                if markdown:
                    write_markdown(self.store, ref, fp)
                else:
                    export_session(self.store, ref, fp)
            os.replace(tmp, path)  # never a half-written file
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return path

    def context_summary(self, session_id: str) -> str:
        """Markdown: the packed files and what was left out, from the session's manifests."""
        manifests = self.store.manifests(session_id)
        if not manifests:
            return "This session has no packed context."
        from agentctx.packing_report import report_lines

        m = manifests[-1]
        packed = sum(1 for f in m.files if f.get("packed") not in ("map", "excerpt"))
        head = f"**{packed} packed, {m.tokens:,} tokens in all**"
        return "\n".join([head, "", "```", *report_lines(m.files, m.omitted), "```"])


def _is_export(path: Path) -> bool:
    """Whether `path` is a regular file that starts as `sessions export` writes one."""
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(40).startswith(b'{"format": "agentctx-session"')
    except OSError:
        return False
