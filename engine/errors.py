"""Engine errors. Each carries a one-line message meant for the user."""

from __future__ import annotations


class EngineError(Exception):
    """Base class: the message is one clear line, shown to the user without a traceback."""


class ModelNotFoundError(EngineError):
    pass


class ModelLoadError(EngineError):
    """A model file or directory exists but cannot be read (corrupt, truncated, bad config)."""


class UnsupportedModelError(EngineError):
    pass


class ContextTooLongError(EngineError):
    def __init__(self, num_tokens: int, window: int, what: str = "prompt"):
        self.num_tokens = num_tokens
        self.window = window
        super().__init__(
            f"{what} is {num_tokens} tokens, longer than the model's window of {window} tokens"
        )


class CacheFullError(EngineError):
    pass
