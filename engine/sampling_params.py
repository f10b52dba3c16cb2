"""Per-request generation options."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GREEDY_BELOW = 1e-5  # temperatures below this sample greedily


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # stop strings, matched on decoded text
    ignore_eos: bool = False
    # > 1 discourages tokens this request already generated (not the prompt, so quoting the
    # context is not penalised): logit / p if positive, logit * p if negative
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    @property
    def greedy(self) -> bool:
        # below GREEDY_BELOW, logits / temperature overflow float32 (inf, then NaN
        # probabilities), and the distribution is the argmax's to float precision anyway
        return self.temperature < GREEDY_BELOW

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that needs the host: the argmax inside a CUDA graph serves it."""
        return self.greedy and self.repetition_penalty == 1.0
