"""Widgets of the chat screen: the message log entries and the context meter."""

from __future__ import annotations

import asyncio
import time

from textual.content import Content
from textual.widgets import Collapsible, Markdown, Static

MAX_RENDER_PAUSE_S = 1.0  # the longest wait between two renders of a streaming answer


class UserMessage(Static):
    """A question, shown as typed (no markup)."""

    def __init__(self, text: str) -> None:
        super().__init__(text, markup=False, classes="user")


class AssistantMessage(Markdown):
    """An answer, rendered as Markdown while it streams: one render at a time, of the newest
    text, appending where the text only grew. (A render per update queued them up behind
    each other on a long answer, and Esc waited seconds behind the queue.)"""

    def __init__(self, text: str = "", status: str = "complete") -> None:
        super().__init__(text, classes="assistant")
        self.text = self.shown = text  # the newest text; the text rendered
        self.rendering = False
        if status != "complete":
            self.add_class(status)

    def set_text(self, text: str) -> None:
        self.text = text
        if not self.rendering and text != self.shown:
            self.rendering = True
            # (a render that fails leaves the last one shown; it must not end the app)
            self.run_worker(self._render_newest(), group="render", exit_on_error=False)

    async def _render_newest(self) -> None:
        try:
            while self.shown != self.text:
                text, start = self.text, time.monotonic()
                if self.shown and text.startswith(self.shown):
                    await self.append(text[len(self.shown) :])
                else:
                    await self.update(text)
                self.shown = text
                # a long answer (a list of a hundred items, say) takes a good part of a
                # second to render: the UI is left free twice that long between renders
                await asyncio.sleep(min(2 * (time.monotonic() - start), MAX_RENDER_PAUSE_S))
        finally:
            self.rendering = False


class ToolCallPanel(Collapsible):
    """One tool call: its name and arguments as the title, its result (or error) inside,
    collapsed until opened."""

    def __init__(self, label: str, output: str, error: bool = False) -> None:
        body = Static(output, markup=False, classes="tool-output")
        mark = "✗" if error else "⚙"
        super().__init__(body, title=f"{mark} {label}", collapsed=True, classes="tool")
        if error:
            self.add_class("tool-error")


class LogLine(Static):
    """One line of information or an error in the log."""

    def __init__(self, text: str, kind: str = "info") -> None:
        super().__init__(text, markup=False, classes=kind)


class ContextMeter(Static):
    """ "context T / W tokens · reused R", amber from 80% of the window and red from 95%;
    where the KV lives when that says something (on a GPU, or in a tiered cache: G and H,
    tokens of KV on the GPU and on the host, from engine.kv_stats), the tokens each
    speculative step gave, whether a Forecast prefetches; then the label (the session).
    T moves while a turn prefills and streams; a turn that fails leaves the last good T."""

    HIGH, FULL = 0.80, 0.95  # shares of the window shown amber, red

    def __init__(self, **kwargs) -> None:
        super().__init__("", markup=False, **kwargs)
        self.tokens: int | None = None
        self.window: int | None = None
        self.reused: int | None = None
        self.label: str = ""
        self.gpu: int | None = None  # tokens of KV on the GPU / on the host (engine.kv_stats)
        self.host: int | None = None
        self.spec: dict | None = None  # the last turn's speculation usage, if any
        self.prefetch: dict | None = None  # the Forecast prefetch's state, if a forecast runs
        self.good: int | None = None  # the last figure a finished turn gave
        self.prompt: int | None = None  # the running turn's prompt tokens, once prefilling

    def on_mount(self) -> None:
        self.refresh_text()

    def set_usage(self, usage: dict | None, window: int | None) -> None:
        """After a turn (or on resume); None clears it."""
        usage = usage or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        self.tokens = self.good = None if prompt is None else prompt + (completion or 0)
        self.reused = usage.get("cached_tokens")
        self.gpu, self.host = usage.get("gpu_tokens"), usage.get("host_tokens")
        self.spec = usage.get("speculation")
        self.prefetch = usage.get("prefetch")
        self.window = window if window is not None else self.window
        self.prompt = None
        self.refresh_text()

    def set_prefill(self, done: int, total: int, window: int | None = None) -> None:
        """The context grows as the prompt is prefilled."""
        self.tokens, self.prompt = done, total
        self.window = window if window is not None else self.window
        self.refresh_text()

    def set_streamed(self, completion: int) -> None:
        """The answer's tokens so far, on top of the prompt."""
        if self.prompt is not None:
            self.tokens = self.prompt + completion
            self.refresh_text()

    def keep_last_good(self) -> None:
        """The turn failed: back to the figure of the last turn that ended."""
        self.tokens, self.prompt = self.good, None
        self.refresh_text()

    def set_label(self, label: str) -> None:
        self.label = label
        self.refresh_text()

    @property
    def fill(self) -> float:
        return (self.tokens or 0) / self.window if self.window else 0.0

    def refresh_text(self) -> None:
        def n(v: int | None) -> str:
            return "—" if v is None else f"{v:,}"

        fill = self.fill
        self.set_class(self.HIGH <= fill < self.FULL, "-high")
        self.set_class(fill >= self.FULL, "-full")
        style = "bold $error" if fill >= self.FULL else "bold $warning" if fill >= self.HIGH else ""
        rest = f" · reused {n(self.reused)}"
        if self.gpu:  # (a dense cache on the CPU has nothing on a GPU: nothing to say)
            rest += f" · on GPU {n(self.gpu)} · on host {n(self.host)}"
        if self.spec:
            rest += f" · speculative decoding: {self.spec['mean_accepted']:.1f} tokens a step"
        if self.prefetch:
            rest += f" · prefetch {'on' if self.prefetch['on'] else 'off'}"
        if self.label:
            rest += f"  │  {self.label}"
        figure = f"context {n(self.tokens)} / {n(self.window)} tokens"
        self.update(Content.assemble((figure, style), rest))
