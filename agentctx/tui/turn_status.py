"""The running turn, in the chat's header: a spinner, the phase (packing, prefill N/M,
tool NAME, decoding), the tokens generated so far and their rate."""

from __future__ import annotations

from textual.widgets import Static

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
SPIN_S = 0.1  # a spinner frame every 100 ms


class TurnStatus(Static):
    """Shown while a turn runs, hidden between turns."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", markup=False, **kwargs)
        self.phase = ""  # "" between turns
        self.tokens, self.tok_s, self.frame = 0, 0.0, 0
        self.display = False

    def on_mount(self) -> None:
        self._spinner = self.set_interval(SPIN_S, self._spin, pause=True)

    def start(self, phase: str = "packing") -> None:
        self.tokens, self.tok_s = 0, 0.0
        self.display = True
        self._spinner.resume()
        self.set_phase(phase)

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self._show()

    def set_decode(self, tokens: int, tok_s: float) -> None:
        self.tokens, self.tok_s = tokens, tok_s
        self.set_phase("decoding")

    def stop(self) -> None:
        self.phase = ""
        self._spinner.pause()
        self.display = False

    def _spin(self) -> None:
        self.frame += 1
        self._show()

    def _show(self) -> None:
        text = f"{SPINNER[self.frame % len(SPINNER)]} {self.phase}"
        if self.tokens:
            text += f" · {self.tokens:,} tokens · {self.tok_s:,.1f} tok/s"
        self.update(text)
