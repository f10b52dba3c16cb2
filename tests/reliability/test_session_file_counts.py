"""Session files state their counts (messages, tool calls, manifests, KV parts) in the
header, and an import refuses a file that does not hold them: every cut of a real exported
session at a line boundary parses line by line, and each is refused, with one line, the
store folder left byte for byte as it was. A version that is not a whole number (1.0) is
refused; version 1 files, written before counts, import as before."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sessions import session_file
from sessions.errors import SessionFileError
from sessions.session_file import export_session, import_session
from sessions.store import SessionStore
from tests.reliability.session_file_support import fill_store, folder_state
from tests.reliability.snapshot_support import tiny_engine, write_snapshot


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> bytes:
    """The bytes of a real KV snapshot (the tiny engine's)."""
    directory = tmp_path_factory.mktemp("kv")
    write_snapshot(tiny_engine(directory), directory / "s.kv")
    return (directory / "s.kv").read_bytes()


def agentctx(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentctx", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AGENTCTX_HOME": str(home)},
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentctx: error:"), proc.stderr
    return lines[0]


def test_every_cut_at_a_line_boundary_is_refused_through_the_cli(tmp_path, snapshot):
    home = tmp_path / "home"
    home.mkdir()
    with SessionStore(home / "sessions.db") as store:
        sid = fill_store(store)
        store.create("/other", "repo", "m", name="unrelated")  # the store is not empty
    (home / "kv").mkdir()
    (home / "kv" / f"{sid}.kv").write_bytes(snapshot)
    exported = tmp_path / "greeter.jsonl"
    proc = agentctx(home, "sessions", "export", sid, "--with-kv", "-o", str(exported))
    assert proc.returncode == 0, proc.stderr
    lines = exported.read_text().splitlines(keepends=True)
    counts = json.loads(lines[0])["counts"]
    assert counts == {"messages": 4, "tool_calls": 1, "manifests": 1, "kv_parts": 1}
    assert len(lines) == 9  # header, session, 4 messages, tool call, manifest, KV
    assert agentctx(home, "sessions", "rm", sid).returncode == 0
    before = folder_state(home)
    for kept in range(len(lines)):
        cut = tmp_path / f"cut-{kept}.jsonl"
        cut.write_text("".join(lines[:kept]))
        error = one_error_line(agentctx(home, "sessions", "import", str(cut)))
        if kept >= 2:  # the header and the session record are whole: only counts tell
            assert "header states" in error, error
        assert folder_state(home) == before, f"the store changed on a cut at line {kept}"
    assert agentctx(home, "sessions", "import", str(exported)).returncode == 0
    with SessionStore(home / "sessions.db") as store:
        assert store.get(sid).message_count == 4
    assert (home / "kv" / f"{sid}.kv").read_bytes() == snapshot


@pytest.fixture
def parts_export(tmp_path, snapshot, monkeypatch) -> list[str]:
    """A real export whose KV snapshot is in 3 parts (smaller parts than export writes,
    so that cuts fall between them)."""
    monkeypatch.setattr(session_file, "KV_PART_BYTES", -(-len(snapshot) // 3))
    kv = tmp_path / "src.kv"
    kv.write_bytes(snapshot)
    with SessionStore(tmp_path / "src.db") as src:
        fp = io.StringIO()
        export_session(src, fill_store(src), fp, kv)
    return fp.getvalue().splitlines(keepends=True)


@pytest.fixture
def target(tmp_path):
    home = tmp_path / "home"
    (home / "kv").mkdir(parents=True)
    with SessionStore(home / "sessions.db") as store:
        store.create("/x", "repo", "m", name="mine")
    return home


def refused(home: Path, text: str) -> str:
    before = folder_state(home)
    path = home.parent / "incoming.jsonl"
    path.write_text(text)
    with SessionStore(home / "sessions.db") as store, pytest.raises(SessionFileError) as e:
        import_session(store, path, home / "kv")
    assert folder_state(home) == before
    assert "\n" not in str(e.value)
    return str(e.value)


def test_every_cut_between_kv_parts_is_refused(target, parts_export):
    assert json.loads(parts_export[0])["counts"]["kv_parts"] == 3
    for kept in range(len(parts_export)):
        refused(target, "".join(parts_export[:kept]))
    whole = target.parent / "whole.jsonl"
    whole.write_text("".join(parts_export))
    with SessionStore(target / "sessions.db") as store:
        assert import_session(store, whole, target / "kv").message_count == 4


def _header(lines: list[str], **changes) -> list[str]:
    header = {**json.loads(lines[0]), **changes}
    return [json.dumps({k: v for k, v in header.items() if v is not ...}) + "\n", *lines[1:]]


def _counts(lines: list[str], **changes) -> list[str]:
    return _header(lines, counts={**json.loads(lines[0])["counts"], **changes})


@pytest.mark.parametrize("version", [1.0, 2.0, True, "2", [2], None, 0, 3, -1, 1e100])
def test_a_version_that_is_not_a_known_whole_number_is_refused(target, parts_export, version):
    error = refused(target, "".join(_header(parts_export, version=version)))
    assert error.startswith("line 1: unsupported version"), error


@pytest.mark.parametrize("counts", [
    {"messages": 5}, {"messages": 3}, {"tool_calls": 0}, {"manifests": 2}, {"kv_parts": 2},
    {"kv_parts": 0}, {"messages": -1}, {"messages": 4.0}, {"messages": True},
    {"messages": "4"}, {"messages": 1 << 64}, {"extra": 1},
])  # fmt: skip
def test_counts_that_do_not_match_are_refused(target, parts_export, counts):
    refused(target, "".join(_counts(parts_export, **counts)))


@pytest.mark.parametrize("counts", [None, [], {}, "4", ...])
def test_a_version_2_header_without_its_counts_is_refused(target, parts_export, counts):
    assert "counts" in refused(target, "".join(_header(parts_export, counts=counts)))


def test_an_added_record_is_refused(target, parts_export):
    message = {**json.loads(parts_export[2]), "seq": 9}
    error = refused(target, "".join([*parts_export, json.dumps(message) + "\n"]))
    assert "messages 5, tool calls 1, manifests 1, kv parts 3 where its header states" in error
    assert "messages 4" in error
    tool_call = next(line for line in parts_export if '"tool_call"' in line)
    assert "tool calls 2" in refused(target, "".join([*parts_export, tool_call]))


def test_a_version_1_file_without_counts_still_imports(target, parts_export):
    old = _header(parts_export, version=1, counts=...)
    path = target.parent / "old.jsonl"
    path.write_text("".join(old))
    with SessionStore(target / "sessions.db") as store:
        assert import_session(store, path, target / "kv").message_count == 4


def test_a_version_1_file_with_counts_is_refused(target, parts_export):
    assert "version 1 header has no counts" in refused(
        target, "".join(_header(parts_export, version=1))
    )


def test_an_exported_time_that_is_not_a_time_is_refused(target, parts_export):
    assert "exported" in refused(target, "".join(_header(parts_export, exported=12)))
