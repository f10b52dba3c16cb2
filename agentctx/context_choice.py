"""What `/add PATH` and `/drop PATH` ask of the next turn: files to pack in full, files to
leave out. A path is taken as the tools take theirs (tools.repo_files): relative to the
root, never outside it, never a secret; an added file must be a readable text file.

A new session's first turn packs with the choice: agentctx.packing reads CHOICE, which the
TUI sets around that one pack call (it passes through backends that need not know of it).
A follow-up's packed context is the session's already: the added files go in full after its
question. Either way the choice is used once, by the next turn."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

from tools.repo_files import confine, read_text, resolve_root

REASON_DROPPED = "dropped with /drop"


@dataclass(slots=True)
class ContextChoice:
    added: dict[str, str] = field(default_factory=dict)  # path -> its text, in /add order
    dropped: list[str] = field(default_factory=list)

    def add(self, root: str, path: str) -> str:
        """The file at `path` (relative to `root`) goes in full; ToolError (one line) for a
        path outside the root, a secret, a missing, binary or too large file."""
        rel = _relative(root, path)
        self.added[rel] = read_text(root, rel)
        if rel in self.dropped:
            self.dropped.remove(rel)
        return rel

    def drop(self, root: str, path: str) -> str:
        rel = _relative(root, path)
        if not confine(root, rel).is_file():
            from tools.errors import UnreadableFileError

            raise UnreadableFileError(f"no such file: {rel}")
        self.added.pop(rel, None)
        if rel not in self.dropped:
            self.dropped.append(rel)
        return rel

    def ranked(self, paths: list[str]) -> list[str]:
        """A packing's ranking with the added files first and the dropped ones out."""
        first = [p for p in self.added if p in paths]
        return first + [p for p in paths if p not in self.added and p not in self.dropped]

    def attach(self, question: str) -> str:
        """A follow-up's question with the added files after it, in full."""
        from agentctx.packing import render_file

        files = [render_file(p, text.split("\n")) for p, text in self.added.items()]
        return "\n\n".join([question, *(f"Added with /add:\n{f}" for f in files)])

    def report(self, count_tokens=None) -> list[str]:
        """For /context: what the next turn adds and leaves out, with tokens (estimated at
        4 characters a token while no tokenizer is loaded)."""

        def tokens(text: str) -> str:
            return f"{count_tokens(text):,}" if count_tokens else f"about {len(text) // 4:,}"

        out = [f"  + {p}  {tokens(t)} tokens, in full" for p, t in self.added.items()]
        out += [f"  - {p}  left out" for p in self.dropped]
        return ["for the next turn (/add, /drop):", *out] if out else []

    def pack(self, conversation, turn, history: list[dict] | None, output) -> None:
        """conversation.pack(turn, ...) with this choice, which it uses up: a new session's
        packing takes it, a follow-up gets the added files after its question."""
        if history is not None and self.added:
            turn.question = self.attach(turn.question)
        token = CHOICE.set(self)
        try:
            conversation.pack(turn, history, output)
        finally:
            CHOICE.reset(token)
        self.clear()  # (the TUI's /add and /drop wait while a turn runs)

    def clear(self) -> None:
        self.added.clear()
        self.dropped.clear()


# the choice the pack running in this thread uses (None: none)
CHOICE: ContextVar[ContextChoice | None] = ContextVar("context_choice", default=None)


def _relative(root: str, path: str) -> str:
    """`path` (relative to the root, or absolute inside it) as the root-relative POSIX path
    the packing names files by."""
    base = resolve_root(root)
    return confine(base, path.strip()).relative_to(base).as_posix()
