"""Fuzzed session files: a real export (four turns, a tool call, a manifest and a real KV
snapshot in three parts) edited by hypothesis (cuts, dropped, repeated and swapped lines,
fields set to hostile JSON or deleted, header versions and counts, flipped bytes), then
imported in-process into a store with a session of its own. Each import either succeeds or
raises one StoreError of one line and leaves the store folder byte for byte as it was;
nothing else may escape, and a file imported under the export's own header is whole. At
least 300 files per run (derandomized: the same ones each run)."""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessions import session_file
from sessions.errors import StoreError
from sessions.session_file import export_session, import_session
from sessions.store import SessionStore
from tests.reliability.fuzz_support import EXAMPLES, FUZZ, as_bytes, mutate_lines
from tests.reliability.session_file_support import fill_store, folder_state
from tests.reliability.snapshot_support import tiny_engine, write_snapshot


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """(the exported lines, a store folder to copy for each example)."""
    base = tmp_path_factory.mktemp("fuzz-sessions")
    write_snapshot(tiny_engine(base), base / "src.kv")
    part_bytes = session_file.KV_PART_BYTES
    session_file.KV_PART_BYTES = -(-(base / "src.kv").stat().st_size // 3)
    try:
        with SessionStore(base / "src.db") as src:
            fp = io.StringIO()
            export_session(src, fill_store(src), fp, base / "src.kv")
    finally:
        session_file.KV_PART_BYTES = part_bytes
    home = base / "home"
    (home / "kv").mkdir(parents=True)
    with SessionStore(home / "sessions.db") as store:
        store.create("/x", "repo", "m", name="mine")
    return fp.getvalue().splitlines(keepends=True), home


def test_fuzzed_session_files_import_or_are_refused_cleanly(pristine):
    lines, home = pristine
    outcomes = {"imported": 0, "refused": 0}
    whole = {"messages": 4, "tool_calls": 1, "manifests": 1, "kv": True}

    @FUZZ
    @given(st.data())
    def one(data):
        what, text = mutate_lines(data.draw, lines)
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "home"
            shutil.copytree(home, target)
            before = folder_state(target)
            path = Path(tmp) / "fuzzed.jsonl"
            path.write_bytes(as_bytes(text))
            with SessionStore(target / "sessions.db") as store:
                try:
                    imported = import_session(store, path, target / "kv")
                except StoreError as e:
                    assert "\n" not in str(e) and str(e).strip(), (what, str(e))
                    outcomes["refused"] += 1
                else:
                    held = _held(store, imported.id, target / "kv")
                    # what imports is whole: what the header counts (or, where the header
                    # is the export's own, what the export held) is in the store
                    if text.startswith(lines[0]):
                        assert held == whole, (what, held)
                    outcomes["imported"] += 1
                    return
            assert folder_state(target) == before, what

    one()
    assert sum(outcomes.values()) >= EXAMPLES, outcomes
    assert outcomes["refused"] >= EXAMPLES // 2, outcomes  # the mutations do bite
    print(f"session files: {outcomes}")


def _held(store: SessionStore, session_id: str, kv_dir: Path) -> dict:
    return {
        "messages": len(store.messages(session_id)),
        "tool_calls": len(store.tool_calls(session_id)),
        "manifests": len(store.manifests(session_id)),
        "kv": (kv_dir / f"{session_id}.kv").exists(),
    }
