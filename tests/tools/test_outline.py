from __future__ import annotations

from pathlib import Path

import pytest

from tools.errors import BinaryFileError, FileTooLargeError, PathEscapeError, ToolError
from tools.outline import outline

from .support import hostile_files, write

SOURCE = '''\
"""A module."""

import os

LIMIT = 3


def top(a: int, b: str = "x", *args, key=None, **kw) -> list[int]:
    return []


async def fetch(url):
    pass


@dataclass(frozen=True)
class Point(Base, metaclass=Meta):
    x: int

    @property
    def norm(self) -> float:
        def inner():
            pass
        return 0.0

    class Inner:
        def deep(self):
            pass
'''


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write(root, "mod.py", SOURCE)
    return root


def test_outlines_classes_functions_and_methods(root: Path) -> None:
    assert outline(root, "mod.py").splitlines() == [
        "mod.py (28 lines)",
        "  8-9  def top(a: int, b: str='x', *args, key=None, **kw) -> list[int]",
        "12-13  async def fetch(url)",
        "16-28  @dataclass(frozen=True) class Point(Base, metaclass=Meta)",
        "20-24      @property def norm(self) -> float",
        "26-28      class Inner",
    ]


def test_a_file_with_no_definitions(root: Path) -> None:
    write(root, "consts.py", "A = 1\n")
    assert outline(root, "consts.py") == "consts.py (1 lines): no top-level classes or functions"


def test_syntax_errors_give_the_line(root: Path) -> None:
    write(root, "bad.py", "def ok():\n    pass\n\ndef broken(:\n")
    with pytest.raises(ToolError, match=r"^syntax error in bad.py line 4: "):
        outline(root, "bad.py")


def test_only_python_files(root: Path) -> None:
    write(root, "notes.md", "# hi\n")
    with pytest.raises(ToolError, match="outline supports Python files"):
        outline(root, "notes.md")


def test_refuses_escapes_binary_and_huge_files(root: Path, tmp_path: Path) -> None:
    hostile_files(root, tmp_path / "outside")
    for path in ["../outside/secret.py", str(tmp_path / "outside" / "secret.py"), "leak.py"]:
        with pytest.raises(PathEscapeError):
            outline(root, path)
    with pytest.raises(BinaryFileError):
        outline(root, "blob.py")
    with pytest.raises(BinaryFileError):
        outline(root, "latin.py")
    with pytest.raises(FileTooLargeError):
        outline(root, "huge.py")
