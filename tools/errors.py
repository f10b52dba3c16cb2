"""Tool errors. Each carries a one-line message meant for the user."""

from __future__ import annotations


class ToolError(Exception):
    """Base class: the message is one clear line, shown to the user without a traceback."""


class RootError(ToolError):
    """The repository root is missing, not a directory, or has nothing to read."""


class PathEscapeError(ToolError):
    """A path would lead outside the repository root (.., absolute path, or symlink)."""


class BinaryFileError(ToolError):
    """A file is not UTF-8 text."""


class FileTooLargeError(ToolError):
    def __init__(self, path: str, size: int, limit: int):
        self.path = path
        self.size = size
        self.limit = limit
        super().__init__(f"file too large: {path} ({size:,} bytes, limit {limit:,})")


class UnreadableFileError(ToolError):
    """The OS refused the read: missing file, permissions, a directory."""


class SecretPathError(ToolError):
    """The path looks like a secret (tools.secrets): no tool shows it to the model."""


class PatternError(ToolError):
    """A regular expression that is invalid, too long, too complex or too slow to match."""
