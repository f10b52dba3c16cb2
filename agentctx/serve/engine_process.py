"""The engine's own process under `agentctx serve`: it loads the model, then steps it while
any request is unfinished, so requests that arrive together run in the same forward passes
(continuous batching). The HTTP process (agentctx.serve.runner) sends it commands and gets
one message a step back: the requests it added or refused, every request's new events and
the engine's counters.

Why a process and not a thread: the event loop writing every client's chunk and the thread
stepping the engine shared one interpreter lock, and at 16 streaming clients the chunks'
~1 ms a step of Python stretched each step by as much (docs/benchmarks.md). Here the engine
waits for nothing but its commands, read between two steps (like vLLM's engine core).

The model loads on the thread that steps it (this process's main thread): on the CPU,
torch's OpenMP pool belongs to the thread that started it, and a second thread's pool
beside it makes both sleep between parallel regions (decode at half speed).

Commands, from the HTTP process: ("add", rid, prompt ids, SamplingParams), ("cancel", rid),
("stop",). Messages back: ("loaded", (PromptTokens, counters)) or ("failed", error) once, then
("step", added rids, [(rid, error)], [(rid, [events])], counters) whenever something
changed. The process ends at "stop" or when the HTTP process's end of the pipe closes."""

from __future__ import annotations

import contextlib
import pickle
import signal
import time
from dataclasses import dataclass

from engine.errors import EngineError


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the process loads: Engine.load's arguments."""

    model: str | None
    device: str = "auto"
    weights: str = "auto"
    config: object | None = None  # engine.config.EngineConfig


def portable(error: BaseException) -> BaseException:
    """The error itself where it survives pickling, else an EngineError with its message."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 (any error that cannot travel becomes its message)
        return EngineError(f"{type(error).__name__}: {error}")


def main(commands, messages) -> None:
    """The process's body: `commands` and `messages` are its ends of the two pipes; the
    first command is the EngineSpec."""
    # the HTTP process decides when to stop: a terminal's Ctrl-C, or a SIGTERM sent to the
    # whole group (systemd's default), reaches this process too, and the HTTP process drains
    # its requests, then sends "stop" (it kills this one if that takes too long); if the HTTP
    # process dies, the closed pipe ends this one
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from engine import Engine
    from engine.runtime.prompt_tokens import PromptTokens

    try:
        spec = commands.recv()
        engine = Engine.load(spec.model, device=spec.device, weights=spec.weights,
                             config=spec.config)  # fmt: skip
    except BaseException as e:  # noqa: BLE001 (the HTTP process raises it to its caller)
        messages.send(("failed", portable(e)))
        return
    facts = PromptTokens(engine.tokenizer, engine.max_model_len, engine.name,
                         engine.model_config.vocab_size)  # fmt: skip
    core = EngineCore(engine, commands, messages)
    messages.send(("loaded", (facts, core.counters())))  # (the cache's size, before any step)
    with contextlib.suppress(EOFError, OSError):  # the HTTP process has gone: so does this one
        core.run()


class EngineCore:
    """The loop: commands between steps, one message after each step."""

    def __init__(self, engine, commands, messages) -> None:
        self.engine, self.commands, self.messages = engine, commands, messages
        self.active: dict[int, object] = {}  # rid -> engine.runtime.requests.Request
        self.added: list[int] = []
        self.refused: list[tuple[int, BaseException]] = []
        self.steps = 0
        self.step_s = 0.0
        self.max_batch = 0

    def run(self) -> None:
        engine = self.engine
        while True:
            # idle: wait for a command (an EOF wakes it too); busy: take what has come
            if not self._take(block=not engine.has_unfinished()):
                return
            events: list = []
            if engine.has_unfinished():
                start = time.perf_counter()
                try:
                    engine.step()
                except Exception as e:  # noqa: BLE001 (the state is suspect: end every request)
                    events = self._fail_all(e)
                else:
                    self.step_s += time.perf_counter() - start
                    self.steps += 1
                    self.max_batch = max(self.max_batch, len(engine.scheduler.running))
                    events = self._collect()
            if events or self.added or self.refused:
                self.messages.send(("step", self.added, self.refused, events, self.counters()))
                self.added, self.refused = [], []

    def _take(self, block: bool) -> bool:
        """Apply every command waiting (with `block`, wait for the first); False at "stop"."""
        if not self.commands.poll(None if block else 0):
            return True
        while True:
            command = self.commands.recv()
            if command[0] == "stop":
                for request in self.active.values():
                    request.cancelled.set()
                return False
            if command[0] == "add":
                self._add(*command[1:])
            elif command[0] == "cancel":
                request = self.active.get(command[1])
                if request is not None and not request.done:
                    request.cancelled.set()  # (its pages are freed at the next step)
            if not self.commands.poll(0):
                return True

    def _add(self, rid: int, prompt: list[int], params) -> None:
        try:
            self.active[rid] = self.engine.add_request(prompt, params)
        except Exception as e:  # noqa: BLE001 (the HTTP side turns engine errors into 4xx)
            self.refused.append((rid, portable(e)))
        else:
            self.added.append(rid)

    def _collect(self) -> list[tuple[int, list]]:
        out = []
        for rid, request in list(self.active.items()):
            events = request.events
            got = []
            while events:
                event = events.popleft()
                if event.kind != "prefill":
                    got.append(event)
            if got:
                out.append((rid, got))
                if got[-1].kind == "done":
                    del self.active[rid]
        return out

    def _fail_all(self, error: Exception) -> list[tuple[int, list]]:
        from engine import StreamEvent
        from engine.runtime.requests import GenerationStats

        out = []
        for rid, request in self.active.items():
            request.cancelled.set()
            stats = request.stats or GenerationStats()
            out.append((rid, [StreamEvent("done", finish_reason=f"error: {error}", stats=stats)]))
        self.active = {}
        return out

    def counters(self) -> dict:
        engine = self.engine
        bm, sched = engine.block_manager, engine.scheduler
        return {
            "running": len(sched.running), "waiting": len(sched.waiting),
            "max_batch": self.max_batch, "steps": self.steps,
            "steps_ahead": engine.steps_launched_ahead, "step_seconds": round(self.step_s, 6),
            "kv_pages_total": bm.num_blocks, "kv_pages_free": bm.num_free_blocks,
        }  # fmt: skip


if __name__ == "__main__":
    import sys
    from multiprocessing.connection import Connection

    with contextlib.suppress(EOFError, OSError):  # (the HTTP process went away before the load)
        main(Connection(int(sys.argv[1]), writable=False),
             Connection(int(sys.argv[2]), readable=False))  # fmt: skip
