"""A turn written to the session store while it happens.

The question is stored before generation starts, with an empty answer marked
`interrupted`; the answer's text is written as it streams (at most FLUSH_S apart) and marked
`complete` when it ends. A process killed at any point, kill -9 included, leaves the turn
in the store with what had streamed, marked interrupted.
"""

from __future__ import annotations

import contextlib
import time

FLUSH_S = 0.5  # seconds of streamed answer a kill -9 may lose
FIRST_CHECK_S = 0.05  # until the first text is written


class TurnRecord:
    """The stored rows of one turn: `answer_id` is the assistant message now streaming
    (a tool step's text, then the next step's)."""

    def __init__(self, store, session, answer_id: int, added: list[int], created: bool):
        self.store, self.session, self.answer_id = store, session, answer_id
        self.added, self.created = added, created  # (what fail_unanswered removes)
        self.answered = False  # some answer text or a tool step has been stored
        self._flushed, self._last = "", 0.0

    @classmethod
    def start(cls, store, turn) -> TurnRecord:
        """Store the turn's question (agentctx.conversation.Turn): for a new session
        (turn.session None) its system and user messages and the packing manifest, else the
        question as a follow-up. A new session named `turn.name` is taken or created under
        one write lock, so processes racing to create it all store their turns in it: the
        first creates it, the others follow up."""
        from sessions.errors import SessionNotFound

        session, name, packed = turn.session, turn.name, turn.packed
        with store.transaction():
            if session is None and name is not None:
                with contextlib.suppress(SessionNotFound):
                    session = store.get(name)
            created = session is None
            if created:
                session = store.create(turn.root, turn.kind, turn.model or "default", name=name)
                added = [store.add_message(session.id, m["role"], m["content"]).id
                         for m in turn.messages]  # fmt: skip
                if packed is not None:
                    from agentctx.packing_report import stored_manifest

                    files, omitted = stored_manifest(packed)
                    store.add_manifest(
                        session.id, files, omitted, tokens=packed.tokens, commit_sha=packed.commit
                    )
            else:
                added = [store.add_message(session.id, "user", turn.question).id]
            answer = store.add_message(session.id, "assistant", "", status="interrupted")
        return cls(store, session, answer.id, added + [answer.id], created)

    def stream(self, text_so_far) -> None:
        """Called as the answer grows; `text_so_far()` gives its text. The first text is
        written at once (within FIRST_CHECK_S), then at most every FLUSH_S. A write that fails (the store locked
        for longer than its busy timeout) is tried again at the next one; `finish` must
        succeed."""
        from sessions.errors import StoreError

        now = time.monotonic()
        if now - self._last < (FLUSH_S if self._flushed else FIRST_CHECK_S):
            return
        text, self._last = text_so_far(), now
        if text and text != self._flushed:
            with contextlib.suppress(StoreError):
                self.store.update_message(self.answer_id, content=text)
                self._flushed, self.answered = text, True

    def step(self, step) -> None:
        """A tool step ended (agentctx.agent.ToolStep, its calls run): its text and calls
        are stored, then what the model was told after them, and the next step's answer
        starts."""
        store = self.store
        with store.transaction():
            store.update_message(self.answer_id, content=step.content, status="complete")
            for c in step.calls:
                store.add_tool_call(self.session.id, c.name, c.arguments, c.result, c.error,
                                    message_id=self.answer_id)  # fmt: skip
            if step.after:  # (agent.after_step)
                self.added.append(store.add_message(self.session.id, "user", step.after).id)
            answer = store.add_message(self.session.id, "assistant", "", status="interrupted")
        self.answer_id, self._flushed, self.answered = answer.id, "", True
        self.added.append(answer.id)

    def finish(self, result, status: str):
        """The answer's final text, token count, timings, status and, when its text is
        them, the ids it was generated as; returns the session."""
        self.store.update_message(
            self.answer_id,
            content=result.answer,
            tokens=result.usage.get("completion_tokens"),
            status=status,
            timings=result.usage,
            token_ids=getattr(result, "token_ids", None),
        )
        self.answered = self.answered or bool(result.answer)
        return self.store.get(self.session.id)

    def fail_unanswered(self) -> None:
        """The turn failed (an error, not an interrupt) before any answer: remove it, so
        the store is as it was; a session this turn created goes too, unless another
        process has added to it meanwhile. Once something was answered it stays, marked
        error."""
        store = self.store
        with store.transaction():
            if self.answered:
                store.update_message(self.answer_id, status="error")
                return
            store.delete_messages(self.session.id, self.added)
            if self.created and not store.messages(self.session.id):
                store.delete(self.session.id)


def save_turn(store, turn):
    """Store a whole turn at once (the TUI stores a turn when it ends): its question, its
    tool steps, then the answer (turn.result, as turn.status), in one transaction. Returns
    the session."""
    with store.transaction():
        record = TurnRecord.start(store, turn)
        for step in turn.result.steps:
            record.step(step)
        return record.finish(turn.result, turn.status)
