"""What a conversation needs from the model that answers it.

`Backend` is the interface agentctx.conversation runs its turns over; `EmbeddedBackend` is
the inference engine in this process (engine.Engine). A backend session is what
`open_session` returns: the KV a stored session's turns share, with `busy` (a request is
running on it) and `close()`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentctx.ask import TurnLinks, TurnResult
    from agentctx.conversation import Turn
    from agentctx.packing import PackedContext


class Backend(ABC):
    """The model side of a turn: packing within its window, running the turn (tool steps
    included) and keeping a session's KV between turns and across restarts."""

    @property
    @abstractmethod
    def window(self) -> int:
        """The tokens a prompt and its answer may take."""

    @abstractmethod
    def pack(
        self, turn: Turn, output, context_tokens: int | None = None, show_packing: bool = False
    ) -> tuple[list[dict], PackedContext]:
        """A new session's first messages and what was packed into them, reported to
        `output` (its summary line, warnings and, with show_packing, the manifest)."""

    @abstractmethod
    def open_session(self, session, output) -> Any:
        """The backend session for a stored session (None: a new one), its KV restored from
        the session's snapshot where one fits."""

    @abstractmethod
    def run(self, turn: Turn, output, links: TurnLinks) -> TurnResult:
        """Run the turn over turn.messages, streaming the answer to `output`."""

    @abstractmethod
    def save_snapshot(self, es, session_id: str, output) -> None:
        """Keep a backend session's KV as the stored session's snapshot (where it can)."""

    def prompt_tokens(self, turn: Turn, messages: list[dict]) -> int | None:
        """The tokens of the turn's prompt over `messages`; None where it cannot count
        them (the prompt is then sent as it is, not compacted: agentctx.compaction)."""
        return None


class EmbeddedBackend(Backend):
    """The engine in this process: packing counts its tokens, turns stream from it and a
    session's KV is saved as a snapshot file (agentctx.kv_snapshots)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    @classmethod
    def load(cls, model: str, **options) -> EmbeddedBackend:
        """engine.Engine.load(model, **options): device, weights, config."""
        from engine import Engine

        return cls(Engine.load(model, **options))

    @property
    def window(self) -> int:
        return self.engine.max_model_len

    def pack(self, turn, output, context_tokens=None, show_packing=False):
        from agentctx.ask import new_session_messages

        return new_session_messages(
            self.engine, turn.root, turn.question, turn.params, context_tokens, output,
            turn.kind, show_packing,
        )  # fmt: skip

    def open_session(self, session, output):
        from agentctx.ask import open_engine_session

        return open_engine_session(self.engine, session, output)

    def run(self, turn, output, links):
        from agentctx.ask import run_turn

        return run_turn(
            self.engine, turn.messages, turn.params, output, turn.root, turn.kind,
            turn.max_steps, links,
        )  # fmt: skip

    def prompt_tokens(self, turn, messages):
        from agentctx.ask import prompt_tokens

        return prompt_tokens(self.engine, messages, turn.root, turn.kind, turn.max_steps)

    def save_snapshot(self, es, session_id, output) -> None:
        from agentctx.ask import save_kv

        save_kv(es, session_id, output)
