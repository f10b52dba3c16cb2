"""The TUI's slash commands: /help, /new, /sessions, /repo, /book, /export, /model, /set,
/context, /compact. Each acts through the app, which owns the state."""

from __future__ import annotations

from agentctx.tui.errors import user_errors
from agentctx.tui.sessions_screen import SessionsScreen

HELP = """\
**Commands**

- `/new`: start a new session
- `/sessions`: list sessions (Enter resume, r rename, d delete after a y / n question)
- `/repo PATH`: the repository for the next new session
- `/book FILE`: the next new session reads that book
- `/export [PATH]`: write this session to PATH (a .md name: a Markdown transcript), or to
  SESSION_ID.jsonl in PATH or the current directory
- `/model NAME`: load another model
- `/context`: what this session's context holds: every file packed, outlined or left out,
  with its tokens, and what /add and /drop change for the next turn
- `/add PATH`, `/drop PATH`: pack that file in full in the next turn, or leave it out
  (a path in the repository; not a secret)
- `/compact`: leave out of the next questions' prompt every earlier tool result and all
  turns but the last (the store keeps them; the packed context stays whole)
- `/set [NAME VALUE]`: show or change temperature, top_p, top_k, max_tokens,
  repeat_penalty, seed (none: random again), steps (tool steps a turn may take)
- `/help`: this list

**Keys**

- Enter: send · Shift-Enter or Ctrl-J: a new line (a paste keeps all its lines)
- Up / Down (on the box's first / last line): the questions sent before in this session
- Tab: complete a command, or a path in the repository
- Esc: cancel the answer (the partial answer is kept)
- ^s: sessions · ^n: new session · ^q: quit
- ^p: the command palette (the theme is chosen there, among other things)"""


class SlashCommands:
    def __init__(self, app) -> None:
        self.app = app

    def run(self, line: str) -> None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        command = getattr(self, f"cmd_{name[1:]}", None) if name[1:].isidentifier() else None
        if command is None:
            self.app.chat.add_line(f"unknown command {name}; /help lists them", "error")
            return
        if self.app.busy and name not in ("/help", "/context"):
            self.app.chat.add_line(f"{name}: an answer is running; wait, or press Esc", "error")
            return
        command(arg)

    def cmd_help(self, arg: str) -> None:
        self.app.chat.add_line(HELP, markdown=True)

    def cmd_new(self, arg: str) -> None:
        self.app.new_session()

    def cmd_sessions(self, arg: str) -> None:
        self.app.push_screen(SessionsScreen())

    def cmd_repo(self, arg: str) -> None:
        from tools.repo_files import resolve_root

        if not arg:
            self.app.chat.add_line(f"repository: {self.app.repo or '.'}; /repo PATH changes it")
            return
        try:
            self.app.repo = str(resolve_root(arg))
        except (OSError, RuntimeError, *user_errors()) as e:  # (~nosuchuser, a name too long)
            self.app.chat.add_line(f"/repo: {e}", "error")
            return
        self.app.kind = "repo"
        self.app.chat.add_line(f"new sessions read {self.app.repo}")
        if self.app.session is None:
            self.app._update_label()

    def cmd_book(self, arg: str) -> None:
        import os

        from tools.book import book_lines

        if not arg:
            self.app.chat.add_line("/book FILE: the next new session reads that book", "error")
            return
        try:
            book_lines(arg)  # exists, one text file, not empty
        except (OSError, RuntimeError, *user_errors()) as e:  # (~nosuchuser, a name too long)
            self.app.chat.add_line(f"/book: {e}", "error")
            return
        self.app.repo, self.app.kind = os.path.realpath(arg), "book"
        self.app.new_session()
        self.app.chat.add_line(f"new sessions read the book {self.app.repo}")

    def cmd_export(self, arg: str) -> None:
        if self.app.session is None:
            self.app.chat.add_line(
                "nothing to export: this session has no stored turn yet", "error"
            )
            return
        try:
            path = self.app.sessions.export(self.app.session.id, arg.strip() or None)
        except (OSError, *user_errors()) as e:
            self.app.chat.add_line(f"export failed: {e}", "error")
            return
        self.app.chat.add_line(f"exported {self.app.session.id} to {path}")

    def cmd_model(self, arg: str) -> None:
        if not arg:
            self.app.chat.add_line(
                f"model: {self.app.model or '(default)'}; /model NAME changes it"
            )
            return
        self.app.turns.load_model(arg)

    def cmd_set(self, arg: str) -> None:
        """/set NAME VALUE: a sampling setting for the next answers, stored with the session
        (agentctx.sampling_settings checks it, as it does config.json's)."""
        from agentctx.sampling_settings import describe, parse

        key, _, value = arg.partition(" ")
        if not key:
            line = describe(self.app.params, self.app.max_steps)
            self.app.chat.add_line(f"{line}; /set NAME VALUE changes one")
            return
        try:
            field, number = parse(key, value)
            window = getattr(self.app.engine, "max_model_len", None)
            if field == "max_tokens" and window and number >= window:
                raise ValueError(f"must be less than the model's {window}-token window")
        except ValueError as e:
            self.app.chat.add_line(f"/set {key}: {e}", "error")
            return
        try:
            self.app.sampling.set(field, number)
        except user_errors() as e:  # used from now on; the store refused to keep it
            self.app.chat.add_line(f"{key} = {number} (not stored with the session: {e})")
            return
        self.app.chat.add_line(f"{key} = {'none' if number is None else number}")

    def cmd_compact(self, arg: str) -> None:
        app = self.app
        if app.session is None:
            app.chat.add_line("nothing to compact: this session has no stored turn yet", "error")
            return
        try:
            history = app.sessions.history(app.session.id)
        except user_errors() as e:
            app._session_gone(e)
            return
        app.chat.add_line(app.turns.conversation.compact(app.session, history, app.max_steps))

    def cmd_context(self, arg: str) -> None:
        count = getattr(self.app.engine, "count_tokens", None)
        pending = self.app.turns.choice.report(count)
        if self.app.session is None:
            self.app.chat.add_line("no context yet: the first question packs the repository")
            if pending:
                self.app.chat.add_line("\n".join(["```", *pending, "```"]), markdown=True)
            return
        try:
            summary = self.app.sessions.context_summary(self.app.session.id)
        except user_errors() as e:
            self.app._session_gone(e)
            return
        if pending:
            summary += "\n\n" + "\n".join(["```", *pending, "```"])
        self.app.chat.add_line(summary, markdown=True)

    def cmd_add(self, arg: str) -> None:
        self._choose("add", arg)

    def cmd_drop(self, arg: str) -> None:
        self._choose("drop", arg)

    def _choose(self, verb: str, path: str) -> None:
        """/add or /drop PATH: checked now (one line if refused), used by the next turn."""
        session = self.app.session
        kind = session.root_kind if session is not None else self.app.kind
        if not path or kind == "book":
            what = "a repository's file" if kind == "book" else "PATH"
            self.app.chat.add_line(f"/{verb} takes {what}: /{verb} PATH", "error")
            return
        root = session.root if session is not None else (self.app.repo or ".")
        try:
            rel = getattr(self.app.turns.choice, verb)(root, path)
        except (OSError, *user_errors()) as e:
            self.app.chat.add_line(f"/{verb}: {e}", "error")
            return
        done = "goes in full" if verb == "add" else "is left out"
        self.app.chat.add_line(f"{rel} {done} in the next turn; /context lists the changes")
