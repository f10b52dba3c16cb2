"""The engine, driven from async code: it runs in its own process
(agentctx.serve.engine_process says why), and this side hands it requests and hands each
request's events to the event loop that awaits them.

Two threads carry the pipes, so that the event loop never blocks on them: one sends the
commands in the order they were given (a long prompt waits for the engine's next pause
between steps, not the loop), one receives a message a step and passes it to the loop in one
call (one wake-up per step, not one per token)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from agentctx.serve.engine_process import EngineSpec
from agentctx.serve.openai_schema import ApiError
from engine import SamplingParams, StreamEvent
from engine.errors import EngineError
from engine.runtime.requests import GenerationStats

STOP_WAIT_S = 10.0  # how long the engine's process may take to exit once told to stop


@dataclass(slots=True)
class RequestHandle:
    rid: int
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    admitted: asyncio.Future | None = None
    finished: bool = field(default=False)

    async def events(self) -> AsyncIterator[list[StreamEvent]]:
        """The request's events in the order they came, as lists of every event that had
        arrived (one step's when the loop keeps up; several steps' when it fell behind the
        engine, which the caller then sends as one chunk); the "done" event is the last."""
        queue = self.queue
        while True:
            got = [await queue.get()]
            while not queue.empty():
                got.append(queue.get_nowait())
            yield got
            if got[-1].kind == "done":
                return


class EngineRunner:
    def __init__(self, spec: EngineSpec) -> None:
        """`spec`: what the engine's process loads once started."""
        self.spec = spec
        self._process: subprocess.Popen | None = None
        self._commands: Connection | None = None
        self._messages: Connection | None = None
        self.facts = None  # engine.runtime.prompt_tokens.PromptTokens, once loaded
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self._gone: str | None = None  # why the engine's process is no longer there
        self.admitting = True
        self.counters: dict = {}  # the engine's, as of its last step
        self._handles: dict[int, RequestHandle] = {}
        self._ids = itertools.count(1)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, name="engine-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name="engine-writer", daemon=True)

    def start(self) -> None:
        """Start the engine's process (it loads the model) and the threads on the pipes."""
        theirs_in, ours_out = os.pipe()
        ours_in, theirs_out = os.pipe()
        # (a fresh interpreter, not a fork of this one and its threads; this one's import path)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        command = [sys.executable, "-m", "agentctx.serve.engine_process", str(theirs_in),
                   str(theirs_out)]  # fmt: skip
        try:
            self._process = subprocess.Popen(command, pass_fds=(theirs_in, theirs_out), env=env,
                                             stdin=subprocess.DEVNULL)  # fmt: skip
        finally:
            os.close(theirs_in)  # (this side's copies: the pipes end when the process does)
            os.close(theirs_out)
        self._commands = Connection(ours_out, readable=False)
        self._messages = Connection(ours_in, writable=False)
        self._outbox.put(self.spec)
        self._reader.start()
        self._writer.start()

    def loaded(self):
        """The model's tokenizer, window and vocabulary (a PromptTokens) once the engine has
        loaded (waits); a load's error is raised here."""
        self._loaded.wait()
        if self._load_error is not None:
            raise self._load_error
        return self.facts

    @property
    def active(self) -> int:
        """Requests submitted and not finished."""
        return len(self._handles)

    async def submit(self, prompt: list[int], params: SamplingParams) -> RequestHandle:
        """The request's handle once the engine has added it (before its next step). Engine
        errors (a prompt longer than the window, a cache too small for it) raise here."""
        if self._gone is not None:
            raise ApiError(503, f"the engine has stopped: {self._gone}", kind="server_error")
        loop = asyncio.get_running_loop()
        handle = RequestHandle(next(self._ids), asyncio.Queue(), loop, loop.create_future())
        self._handles[handle.rid] = handle
        if self._gone is not None:  # (it went between the check and the handle's entry)
            self._handles.pop(handle.rid, None)
            raise ApiError(503, f"the engine has stopped: {self._gone}", kind="server_error")
        self._outbox.put(("add", handle.rid, prompt, params))
        return await handle.admitted

    def cancel(self, handle: RequestHandle) -> None:
        """Cancel a request that has not finished (its pages are freed at the next step)."""
        if not handle.finished:
            self._outbox.put(("cancel", handle.rid))

    async def drain(self, timeout: float) -> None:
        """Stop admitting; wait up to `timeout` seconds for the running requests, then cancel
        the rest and stop the engine's process."""
        self.admitting = False
        deadline = time.monotonic() + timeout
        while self._handles and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for handle in list(self._handles.values()):
            self.cancel(handle)
        while self._handles and time.monotonic() < deadline + 5:
            await asyncio.sleep(0.02)
        await asyncio.to_thread(self.stop)

    def stop(self) -> None:
        """Tell the engine's process to exit and wait for it (killed if it does not)."""
        process = self._process
        if process is not None and process.poll() is None:
            self._outbox.put(("stop",))
            try:
                process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_WAIT_S)
        self._outbox.put(None)

    # -- the pipes' threads -----------------------------------------------------------------

    def _write(self) -> None:
        while (command := self._outbox.get()) is not None:
            try:
                self._commands.send(command)
            except OSError:  # (the process has gone: the reader says so)
                return

    def _read(self) -> None:
        try:
            kind, value = self._messages.recv()
        except (EOFError, OSError):
            code = self._exit_code()
            kind, value = "failed", EngineError(f"the engine's process exited while loading "
                                                f"(exit code {code})")  # fmt: skip
        if kind == "failed":
            self._load_error = value
            self._loaded.set()
            return
        self.facts, self.counters = value
        self._loaded.set()
        while True:
            try:
                message = self._messages.recv()
            except (EOFError, OSError):
                break
            self._dispatch(*message[1:])
        self._gone = f"its process exited (exit code {self._exit_code()})"
        self._end_all(f"error: the engine {self._gone}")

    def _exit_code(self) -> int | None:
        try:
            return self._process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            return None

    def _dispatch(self, added, refused, events, counters) -> None:
        """One step's message, handed to each event loop concerned in one call."""
        self.counters = counters
        work: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
        for rid in added:
            handle = self._handles[rid]
            work[handle.loop].append((_admit, handle, self))
        for rid, error in refused:
            handle = self._handles.pop(rid)
            work[handle.loop].append((_refuse, handle, error))
        for rid, got in events:
            handle = self._handles[rid]
            if got[-1].kind == "done":
                handle.finished = True
                del self._handles[rid]
            work[handle.loop].append((_deliver, handle, got))
        for loop, items in work.items():
            _call(loop, _apply, items)

    def _end_all(self, reason: str) -> None:
        handles, self._handles = list(self._handles.values()), {}
        for handle in handles:
            handle.finished = True
            if not handle.admitted.done():
                error = ApiError(503, reason.removeprefix("error: "), kind="server_error")
                _call(handle.loop, _apply, [(_refuse, handle, error)])
            else:
                done = StreamEvent("done", finish_reason=reason, stats=GenerationStats())
                _call(handle.loop, _apply, [(_deliver, handle, [done])])


def _call(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    with contextlib.suppress(RuntimeError):  # (a closed loop: nobody awaits these requests)
        loop.call_soon_threadsafe(fn, *args)


def _apply(items: list) -> None:
    for fn, *args in items:
        fn(*args)


def _admit(handle: RequestHandle, runner: EngineRunner) -> None:
    if handle.admitted.done():  # the client went away while its request waited to be added
        runner.cancel(handle)
    else:
        handle.admitted.set_result(handle)


def _refuse(handle: RequestHandle, error: BaseException) -> None:
    if not handle.admitted.done():
        handle.admitted.set_exception(error)


def _deliver(handle: RequestHandle, events: list) -> None:
    for event in events:
        handle.queue.put_nowait(event)
