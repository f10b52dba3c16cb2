"""Widgets of the chat screen: the message log entries and the context meter."""

from __future__ import annotations

from textual.widgets import Collapsible, Markdown, Static


class UserMessage(Static):
    """A question, shown as typed (no markup)."""

    def __init__(self, text: str) -> None:
        super().__init__(text, markup=False, classes="user")


class AssistantMessage(Markdown):
    """An answer, re-rendered as Markdown while it streams."""

    def __init__(self, text: str = "", status: str = "complete") -> None:
        super().__init__(text, classes="assistant")
        self.text = text
        if status != "complete":
            self.add_class(status)

    def set_text(self, text: str) -> None:
        if text != self.text:
            self.text = text
            self.update(text)


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
    """ "context T / W tokens · reused R · on GPU G · on host H", plus prefill progress
    (G and H: tokens of KV in each tier, from engine.kv_stats; "—" before the first turn),
    and, when the last turn speculated, the tokens each verification gave; with a Forecast,
    whether it prefetches now."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", markup=False, **kwargs)
        self.tokens: int | None = None
        self.window: int | None = None
        self.reused: int | None = None
        self.prefill: str = ""
        self.label: str = ""
        self.gpu: int | None = None  # tokens of KV on the GPU / on the host (engine.kv_stats)
        self.host: int | None = None
        self.spec: dict | None = None  # the last turn's speculation usage, if any
        self.prefetch: dict | None = None  # the Forecast prefetch's state, if a forecast runs

    def on_mount(self) -> None:
        self.refresh_text()

    def set_usage(self, usage: dict | None, window: int | None) -> None:
        """After a turn (or on resume); None clears it."""
        usage = usage or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        self.tokens = None if prompt is None else prompt + (completion or 0)
        self.reused = usage.get("cached_tokens")
        self.gpu, self.host = usage.get("gpu_tokens"), usage.get("host_tokens")
        self.spec = usage.get("speculation")
        self.prefetch = usage.get("prefetch")
        self.window = window if window is not None else self.window
        self.prefill = ""
        self.refresh_text()

    def set_prefill(self, done: int, total: int, tok_s: float, window: int | None = None) -> None:
        pct = 100 * done // max(total, 1)
        self.tokens = done  # the context grows as the prompt is prefilled
        self.window = window if window is not None else self.window
        self.prefill = "" if done >= total else f"prefill {pct}% · {tok_s:,.0f} tok/s"
        self.refresh_text()

    def set_label(self, label: str) -> None:
        self.label = label
        self.refresh_text()

    def refresh_text(self) -> None:
        def n(v: int | None) -> str:
            return "—" if v is None else f"{v:,}"

        text = (
            f"context {n(self.tokens)} / {n(self.window)} tokens · reused {n(self.reused)}"
            f" · on GPU {n(self.gpu)} · on host {n(self.host)}"
        )
        if self.spec:
            text += f" · {self.spec['mean_accepted']:.1f} tokens per verification"
        if self.prefetch:
            text += f" · prefetch {'on' if self.prefetch['on'] else 'off'}"
        if self.prefill:
            text += f"  │  {self.prefill}"
        if self.label:
            text = f"{self.label}  │  {text}"
        self.update(text)
