"""Engine errors. Each carries a one-line message meant for the user."""

from __future__ import annotations


class EngineError(Exception):
    """Base class: the message is one clear line, shown to the user without a traceback."""


class ModelNotFoundError(EngineError):
    pass


class KernelsShadowedError(ImportError):
    """The `kernels` package found first on sys.path is another distribution's."""


class ModelLoadError(EngineError):
    """A model file or directory exists but cannot be read (corrupt, truncated, bad config)."""


class UnsupportedModelError(EngineError):
    pass


class ContextTooLongError(EngineError):
    """note: why the window is what it is, where the config suggests a longer one
    (ModelConfig.window_note)."""

    def __init__(self, num_tokens: int, window: int, what: str = "prompt", note: str | None = None):
        self.num_tokens = num_tokens
        self.window = window
        self._args = (num_tokens, window, what, note)
        super().__init__(
            f"{what} is {num_tokens} tokens, longer than the model's window of {window} tokens"
            + (f" ({note})" if note else "")
        )

    def __reduce__(self):  # (pickled with its own arguments: it crosses agentctx serve's pipe)
        return type(self), self._args


class CacheFullError(EngineError):
    pass


class StepCancelled(Exception):
    """Every sequence of a step was cancelled while it ran, so the step stopped between two
    layers (a long prefill chunk on the CPU). Internal: the engine ends those requests."""
