"""One turn of a conversation, the same for `agentctx ask` and the TUI.

A `Turn` is what was asked, about what, and what came back (simonw/llm's Response); a
`Conversation` runs turns over a Backend (agentctx.backend) in the order every front end
follows: pack (or send the stored turns again), open the backend session, run, save,
snapshot the KV. The backend session stays open between turns (llm's Conversation), so a
follow-up reuses the KV of everything before it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentctx.agent import DEFAULT_MAX_STEPS
from agentctx.compaction import KEY, Compaction, compact_to_fit

if TYPE_CHECKING:
    from agentctx.ask import TurnResult
    from agentctx.backend import Backend
    from agentctx.packing import PackedContext
    from sessions.models import Session


@dataclass(slots=True)
class Turn:
    question: str
    root: str | None  # the repository or book it reads
    kind: str = "repo"  # "repo" or "book"
    session: Session | None = None  # the stored session it follows up; None: a new one
    name: str | None = None  # the name a new session takes (ask --session NAME)
    model: str | None = None  # stored with a new session
    params: Any = None  # engine.SamplingParams
    max_steps: int = DEFAULT_MAX_STEPS  # tool steps it may take
    messages: list[dict] = field(default_factory=list)  # what the model is sent
    packed: PackedContext | None = None  # a new session's packing
    result: TurnResult | None = None  # the answer, its tool steps and usage
    status: str = "interrupted"  # how it is stored: "complete" once it ended whole
    compaction: Compaction = field(default_factory=Compaction)  # what its prompt leaves out
    references: bool = True  # show the answer's references (agentctx.references)
    check: bool = True  # an answer the files contradict is asked again (agentctx.answer_check)

    @property
    def usage(self) -> dict | None:
        return self.result.usage if self.result is not None else None


class Conversation:
    """The turns of one stored session at a time over `backend`. `es` is the backend
    session (its pinned KV); `owner` the stored session's id it holds the KV of (None: a
    new session not stored yet)."""

    def __init__(self, backend: Backend | None = None) -> None:
        self.backend = backend
        self.es: Any = None
        self.owner: str | None = None
        self._opened_by: Backend | None = None
        self.pending: tuple[str, Compaction] | None = None  # /compact's, for a session's next turn

    def open(self, session, output) -> Any:
        """The backend session of `session` (None: a new one): the one already open when
        it is that session's on this backend, else one opened (from its snapshot)."""
        owner = session.id if session is not None else None
        if self.es is not None and self.owner == owner and self._opened_by is self.backend:
            return self.es
        self.es = self.backend.open_session(session, output)
        self.owner, self._opened_by = owner, self.backend
        return self.es

    def pack(
        self, turn: Turn, history: list[dict] | None, output, context_tokens=None,
        show_packing: bool = False,
    ) -> None:  # fmt: skip
        """turn.messages: a follow-up's stored turns (`history`) and its question, as
        compacted to fit the window (fit_window), or a new session's packed context with the
        question (turn.packed: what went in)."""
        if history is not None:
            start = Compaction.stored(history)
            if self.pending is not None and turn.session is not None:
                if self.pending[0] == turn.session.id:
                    start = start.union(self.pending[1])
                self.pending = None
            turn.compaction = start
            full = history + [{"role": "user", "content": turn.question}]
            turn.messages = self.fit_window(turn, full, output)
        else:
            turn.messages, turn.packed = self.backend.pack(
                turn, output, context_tokens, show_packing
            )

    def fit_window(self, turn: Turn, full: list[dict], output) -> list[dict]:
        """`full` as the turn sends it: with what turn.compaction leaves out, and more left
        out (agentctx.compaction) when its prompt and the answer's room would not fit the
        window, which `output` is told."""
        if self.backend.prompt_tokens(turn, full[:1]) is None:  # it cannot count
            return turn.compaction.apply(full)

        def count(messages: list[dict]) -> int:
            return self.backend.prompt_tokens(turn, messages)

        room = getattr(turn.params, "max_tokens", 0)
        turn.compaction, sent = compact_to_fit(
            full, count, self.backend.window, room, turn.compaction, output
        )
        return sent

    def compact(self, session: Session, history: list[dict], max_steps: int) -> str:
        """The TUI's /compact: the session's next turns leave out every earlier turn's tool
        results and all its turns but the last (the store keeps them). What that leaves
        out, in words, with the prompt's tokens before and after where the backend can
        count them (a turn has loaded it)."""
        before = Compaction.stored(history)
        if self.pending is not None and self.pending[0] == session.id:
            before = before.union(self.pending[1])
        full = history + [{"role": "user", "content": ""}]
        after = before.most(full)
        if after == before:
            return "nothing more to compact: only the packed context and the last turn are sent"
        self.pending = (session.id, after)
        sizes = ""
        if self.backend is not None:
            turn = Turn("", session.root, session.root_kind, max_steps=max_steps)
            old, new = (self.backend.prompt_tokens(turn, s.apply(full)) for s in (before, after))
            sizes = "" if old is None else f" ({old:,} -> {new:,} prompt tokens)"
        return (
            f"compacted: the next question leaves out {after.left_out_since(before)} of this "
            f"session{sizes}; the session store keeps them, and the packed context is sent whole"
        )

    def run(self, turn: Turn, output, record=None, on_stream=None) -> TurnResult:
        """Run the turn on the open backend session; `record` (agentctx.turn_record) stores
        the answer as it streams, `on_stream` gets each step's stream (to cancel it). What
        its prompt left out is stored with its usage, for the next turn to start from."""
        from agentctx.ask import TurnLinks

        try:
            links = TurnLinks(self.es, record, on_stream, turn.check)
            turn.result = self.backend.run(turn, output, links)
        except KeyboardInterrupt as e:  # the partial answer is stored: with the state too
            partial = getattr(e, "partial", None)
            if partial is not None and turn.compaction:
                partial.usage[KEY] = turn.compaction.data()
            raise
        if turn.compaction:
            turn.result.usage[KEY] = turn.compaction.data()
        if turn.references:
            self._references(turn, output)
        return turn.result

    @staticmethod
    def _references(turn: Turn, output) -> None:
        """The answer's references, checked against the files: shown after it, and kept
        with its usage (stored with the turn, and --json's usage record)."""
        from agentctx.references import for_answer

        if turn.result.finish_reason in ("cancelled", "interrupted"):
            return
        refs = for_answer(turn.result.answer, turn.root, turn.kind)
        if refs:
            turn.result.usage["references"] = [r.data() for r in refs]
            show = getattr(output, "references", None)
            if show is not None:
                show(refs)

    def save(self, store, turn: Turn) -> Session:
        """Store the whole turn (turn.status); a new session's KV is now that session's."""
        from agentctx.turn_record import save_turn

        session = save_turn(store, turn)
        self.stored_as(session.id, turn)
        return session

    def stored_as(self, session_id: str, turn: Turn) -> None:
        """The turn is stored in `session_id`: its usage says so, and the KV of a new
        session belongs to it now."""
        turn.result.usage["session"] = session_id
        if self.es is not None and self.owner is None:
            self.owner = session_id

    def snapshot(self, output) -> None:
        """Save the backend session's KV as its stored session's snapshot (not while a
        request still runs on it, nor for a session not stored)."""
        if self.es is not None and self.owner is not None and not self.es.busy:
            self._opened_by.save_snapshot(self.es, self.owner, output)

    def close(self, output) -> None:
        """Snapshot, then unpin the KV; the next turn opens a backend session again."""
        es = self.es
        if es is None:
            return
        try:
            self.snapshot(output)
        finally:
            self.es = self.owner = self._opened_by = None
            es.close()
