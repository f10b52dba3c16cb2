"""The engine, driven from async code: one thread loads it, then steps it while any request
is unfinished, so requests that arrive together run in the same forward passes (continuous
batching), and hands each request's events to the event loop that awaits them.

Only that thread touches the engine: a new request is queued for it and added between two
steps. (The engine holds its lock for a whole step and the thread steps back to back, so an
event loop that took the lock itself could wait many steps for it, streaming nothing.) It
loads the model too: on the CPU, torch's OpenMP pool belongs to the thread that started it,
and a second thread's pool beside it (the loader's, kept alive by that thread) makes both
sleep between parallel regions instead of spinning. Decode's small matrix products then
wait on every wake-up: a 576 x 576 product took 96 us in place of 14 on 2 cores, and
decode ran at half speed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from agentctx.serve.openai_schema import ApiError
from engine import SamplingParams, StreamEvent
from engine.runtime.requests import GenerationStats

IDLE_WAIT_S = 0.5  # how long the idle thread sleeps between checks for work


@dataclass(slots=True)
class RequestHandle:
    request: object  # engine.runtime.requests.Request
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop

    async def events(self) -> AsyncIterator[list[StreamEvent]]:
        """The request's events in the order they came, as lists of every event that had
        arrived (one when the loop keeps up; several when it fell behind the engine, which
        the caller then sends as one chunk); the "done" event is the last."""
        queue = self.queue
        while True:
            got = [await queue.get()]
            while not queue.empty():
                got.append(queue.get_nowait())
            yield got
            if got[-1].kind == "done":
                return


def _resolve(admitted: asyncio.Future, handle: RequestHandle, runner: EngineRunner) -> None:
    if admitted.done():  # the client went away while its request waited to be added
        runner.cancel(handle)
    else:
        admitted.set_result(handle)


def _fail(admitted: asyncio.Future, error: Exception) -> None:
    if not admitted.done():
        admitted.set_exception(error)


def _put_all(batch: list) -> None:
    for queue, event in batch:
        queue.put_nowait(event)


class EngineRunner:
    def __init__(self, load: Callable[[], object]) -> None:
        """`load()`: the engine, made on the runner's thread once started."""
        self._load = load
        self.engine = None
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self.admitting = True
        self.max_batch = 0  # the most sequences running together after a step
        self.steps = 0
        self.step_s = 0.0  # seconds inside the engine's steps (the rest: admitting, handing
        # over events, waiting for the interpreter lock or for work)
        self._active: dict[int, RequestHandle] = {}
        self._pending: list[tuple] = []  # (prompt, params, queue, loop, future) to add
        self._work = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="engine", daemon=True)

    def start(self) -> None:
        """Start the thread: it loads the engine, then steps it."""
        self._thread.start()

    def loaded(self):
        """The engine once loaded (waits); a load's error is raised here."""
        self._loaded.wait()
        if self._load_error is not None:
            raise self._load_error
        return self.engine

    def _main(self) -> None:
        try:
            self.engine = self._load()
        except BaseException as e:  # noqa: BLE001 (raised again by loaded(), in the caller)
            self._load_error = e
            return
        finally:
            self._loaded.set()
        self._loop()

    async def submit(self, prompt: list[int], params: SamplingParams) -> RequestHandle:
        """The request's handle once the engine's thread has added it (before its next
        step). Engine errors (a prompt longer than the window, a cache too small for it)
        raise here."""
        loop = asyncio.get_running_loop()
        admitted = loop.create_future()
        with self._work:
            self._pending.append((prompt, params, asyncio.Queue(), loop, admitted))
            self._work.notify()
        return await admitted

    def cancel(self, handle: RequestHandle) -> None:
        """Cancel a request that has not finished (its pages are freed at the next step)."""
        if not handle.request.done:
            handle.request.cancelled.set()
            with self._work:
                self._work.notify()

    @property
    def active(self) -> int:
        return len(self._active)

    async def drain(self, timeout: float) -> None:
        """Stop admitting; wait up to `timeout` seconds for the running requests, then cancel
        the rest and stop the thread."""
        self.admitting = False
        deadline = time.monotonic() + timeout
        while self._active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for handle in list(self._active.values()):
            self.cancel(handle)
        while self._active and time.monotonic() < deadline + 5:
            await asyncio.sleep(0.02)
        with self._work:
            self._stopping = True
            self._work.notify()
        await asyncio.to_thread(self._thread.join, 5)

    def _loop(self) -> None:
        engine = self.engine
        while True:
            with self._work:
                while not self._stopping and not self._pending and not engine.has_unfinished():
                    self._work.wait(IDLE_WAIT_S)
                if self._stopping:
                    pending, self._pending = self._pending, []
                    for *_, loop, admitted in pending:
                        error = ApiError(503, "the server is shutting down", kind="server_error")
                        loop.call_soon_threadsafe(_fail, admitted, error)
                    return
                pending, self._pending = self._pending, []
            for item in pending:
                self._admit(*item)
            if not engine.has_unfinished():
                continue
            start = time.perf_counter()
            try:
                engine.step()
            except Exception as e:  # the engine's state is suspect: end every request
                self._fail_all(e)
                continue
            self.step_s += time.perf_counter() - start
            self.steps += 1
            self.max_batch = max(self.max_batch, len(engine.scheduler.running))
            self._deliver()

    def _admit(self, prompt, params, queue, loop, admitted) -> None:
        try:
            request = self.engine.add_request(prompt, params)
        except Exception as e:  # noqa: BLE001 (the handler turns engine errors into 4xx)
            loop.call_soon_threadsafe(_fail, admitted, e)
            return
        handle = RequestHandle(request, queue, loop)
        with self._work:
            self._active[request.seq.seq_id] = handle
        loop.call_soon_threadsafe(_resolve, admitted, handle, self)

    def _deliver(self) -> None:
        """Hands the step's events to the event loop in one call per loop (one wake-up per
        step, not one per token: the loop and this thread share the GIL)."""
        with self._work:
            handles = list(self._active.items())
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for seq_id, handle in handles:
            events = handle.request.events
            while events:
                event = events.popleft()
                if event.kind == "prefill":
                    continue
                batches.setdefault(handle.loop, []).append((handle.queue, event))
                if event.kind == "done":
                    with self._work:
                        self._active.pop(seq_id, None)
        for loop, batch in batches.items():
            loop.call_soon_threadsafe(_put_all, batch)

    def _fail_all(self, error: Exception) -> None:
        with self._work:
            handles, self._active = list(self._active.values()), {}
        for handle in handles:
            handle.request.cancelled.set()
            stats = handle.request.stats or GenerationStats()
            event = StreamEvent("done", finish_reason=f"error: {error}", stats=stats)
            handle.loop.call_soon_threadsafe(handle.queue.put_nowait, event)
