"""scripts/split_gguf.py: the pieces and the printed device commands rebuild the file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "split_gguf.py"


def run_split(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True,
                          text=True, check=False)  # fmt: skip


def device_commands(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    calls = [lines[i + 1] for i, line in enumerate(lines) if line.startswith("# call ")]
    return calls + [lines[-1]]  # the appends, then the sha256 check


def test_pieces_and_commands_rebuild_the_file(tmp_path: Path) -> None:
    data = os.urandom(5 * 1024 * 1024 + 12345)
    (tmp_path / "m.gguf").write_bytes(data)
    stage = tmp_path / "stage" / "model.gguf"
    r = run_split("m.gguf", "--piece-mib", "2", "--stage", str(stage), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / ".out/pieces/m.pieces.json").read_text())
    assert [p["size"] for p in manifest["pieces"]] == [2 << 20, 2 << 20, len(data) - (4 << 20)]
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    cmds = device_commands(r.stdout)
    assert len(cmds) == 4
    # out of order: the second piece before the first fails and leaves the file empty
    bad = subprocess.run(["bash", "-c", cmds[1]], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode != 0 and "expected 2097152" in bad.stderr
    assert stage.stat().st_size == 0
    for cmd in cmds[:3] + [cmds[1]]:  # a repeated call appends nothing
        subprocess.run(["bash", "-c", cmd], cwd=tmp_path, check=True, capture_output=True)
    assert stage.read_bytes() == data
    subprocess.run(["bash", "-c", cmds[3]], cwd=tmp_path, check=True, capture_output=True)
    stage.write_bytes(data[:-1] + b"\0")
    tampered = subprocess.run(["bash", "-c", cmds[3]], cwd=tmp_path, capture_output=True)
    assert tampered.returncode != 0


@pytest.mark.parametrize("args", [["missing.gguf"], ["m.gguf", "--piece-mib", "61"]])
def test_bad_input_is_one_line(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    r = run_split(*args, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("split_gguf: ")


def test_the_default_piece_leaves_room_for_the_working_tree(tmp_path: Path) -> None:
    """A call carries 64 MiB: the working tree (tracked and untracked files git does not
    ignore) and one piece; the default piece is what is left, less 1 MiB."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("m.gguf\n.out/\n")
    (tmp_path / "tree.bin").write_bytes(os.urandom(5 * 1024 * 1024 + 1))  # untracked, kept
    (tmp_path / "m.gguf").write_bytes(os.urandom(1024))  # ignored: not carried
    r = run_split("m.gguf", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "pieces of at most 57 MiB" in r.stdout  # 64 - 1 - 5.x, rounded down
