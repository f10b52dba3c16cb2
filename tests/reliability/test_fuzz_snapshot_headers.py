"""Fuzzed KV snapshot headers: a real snapshot of the tiny engine with its header edited by
hypothesis (metadata values set to hostile JSON or decimal strings, fields deleted or
added, the tensor entries' dtypes, shapes and offsets changed, whole parts replaced), its
checksum recomputed nine times in ten so that the edit reaches the checks after it. Each
file is opened as `ask -c` opens a session's snapshot: restored (then with exactly the
tokens written) or refused in one line, its pages handed back and the folder unchanged;
nothing else may escape. At least 300 headers per run (derandomized)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.reliability.fuzz_support import EXAMPLES, FUZZ, mutate_header
from tests.reliability.session_file_support import folder_state
from tests.reliability.snapshot_support import join, split, tiny_engine, write_snapshot


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz-snapshots")
    engine = tiny_engine(directory)
    tokens = write_snapshot(engine, directory / "good.kv")
    return engine, (directory / "good.kv").read_bytes(), tokens


def test_fuzzed_snapshot_headers_restore_or_are_refused_cleanly(made):
    engine, data, tokens = made
    header, body = split(data)
    outcomes = {"restored": 0, "refused": 0}

    @FUZZ
    @given(st.data())
    def one(data):
        what, edited, recompute = mutate_header(data.draw, header)
        with tempfile.TemporaryDirectory() as tmp:
            kv = Path(tmp)
            path = kv / "s-abcdef.kv"
            path.write_bytes(join(edited, body, recompute))
            before = folder_state(kv)
            free = engine.block_manager.num_free_blocks
            s = engine.open_session("fuzzed", snapshot=str(path))
            error, restored = s.snapshot_error, list(s.token_ids)
            s.close()
            engine.block_manager.reset_prefix_cache()
            assert engine.block_manager.num_free_blocks == free, what
            assert folder_state(kv) == before, what
            if error is None:
                assert restored == tokens, what
                outcomes["restored"] += 1
            else:
                assert "\n" not in error and error.strip(), (what, error)
                outcomes["refused"] += 1

    one()
    assert sum(outcomes.values()) >= EXAMPLES, outcomes
    assert outcomes["refused"] >= EXAMPLES // 2, outcomes
    print(f"snapshot headers: {outcomes}")
