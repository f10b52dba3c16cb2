"""The engine, driven from async code: one thread steps it while any request is unfinished,
so requests that arrive together run in the same forward passes (continuous batching), and
hands each request's events to the event loop that awaits them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engine import SamplingParams, StreamEvent
from engine.runtime.requests import GenerationStats

IDLE_WAIT_S = 0.5  # how long the idle thread sleeps between checks for work


@dataclass(slots=True)
class RequestHandle:
    request: object  # engine.runtime.requests.Request
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop

    async def events(self) -> AsyncIterator[StreamEvent]:
        """The request's token events, then its "done" event (the last)."""
        while True:
            event = await self.queue.get()
            yield event
            if event.kind == "done":
                return


class EngineRunner:
    def __init__(self, engine) -> None:
        self.engine = engine
        self.admitting = True
        self.max_batch = 0  # the most sequences running together after a step
        self.steps = 0
        self._active: dict[int, RequestHandle] = {}
        self._work = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="engine-steps", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, prompt: list[int], params: SamplingParams) -> RequestHandle:
        """Queue a request (from the event loop's thread). Engine errors (a prompt longer
        than the window, a cache too small for it) raise here."""
        request = self.engine.add_request(prompt, params)
        handle = RequestHandle(request, asyncio.Queue(), asyncio.get_running_loop())
        with self._work:
            self._active[request.seq.seq_id] = handle
            self._work.notify()
        return handle

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
                while not self._stopping and not engine.has_unfinished():
                    self._work.wait(IDLE_WAIT_S)
                if self._stopping:
                    return
            try:
                engine.step()
            except Exception as e:  # the engine's state is suspect: end every request
                self._fail_all(e)
                continue
            self.steps += 1
            self.max_batch = max(self.max_batch, len(engine.scheduler.running))
            self._deliver()

    def _deliver(self) -> None:
        with self._work:
            handles = list(self._active.items())
        for seq_id, handle in handles:
            events = handle.request.events
            while events:
                event = events.popleft()
                if event.kind == "prefill":
                    continue
                handle.loop.call_soon_threadsafe(handle.queue.put_nowait, event)
                if event.kind == "done":
                    with self._work:
                        self._active.pop(seq_id, None)

    def _fail_all(self, error: Exception) -> None:
        with self._work:
            handles, self._active = list(self._active.values()), {}
        for handle in handles:
            handle.request.cancelled.set()
            stats = handle.request.stats or GenerationStats()
            event = StreamEvent("done", finish_reason=f"error: {error}", stats=stats)
            handle.loop.call_soon_threadsafe(handle.queue.put_nowait, event)
