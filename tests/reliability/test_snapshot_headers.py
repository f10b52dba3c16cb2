"""Crafted KV snapshot headers, special files at a snapshot's path, and temporary files
left by killed writers. A real snapshot of a tiny random-weight engine is rewritten field
by field with its header checksum recomputed; each must be refused with one line, its pages
handed back and the file left as it was, and a good snapshot must still restore. Through
the CLI (the real SmolLM2): `ask -c` over a snapshot whose chunk_bytes is "0" answers
after prefilling, and a FIFO at kv/<id>.kv does not hang it."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time

import pytest

from agentctx.kv_snapshots import prune
from engine.kv.snapshot import load_snapshot
from engine.kv.snapshot_header import METADATA_KEYS, SnapshotError, remove_stale_temps
from sessions.store import SessionStore
from tests.reliability.session_file_support import private_home
from tests.reliability.snapshot_support import (
    join,
    loads_or_refuses,
    split,
    tiny_engine,
    write_snapshot,
)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(engine, the snapshot's bytes, the tokens it holds)."""
    directory = tmp_path_factory.mktemp("snapshots")
    engine = tiny_engine(directory)
    path = directory / "good.kv"
    tokens = write_snapshot(engine, path)
    return engine, path.read_bytes(), tokens


def crafted(made, tmp_path, edit, recompute_crc: bool = True):
    engine, data, _ = made
    header, body = split(data)
    header = copy.deepcopy(header)
    header = edit(header) or header
    path = tmp_path / "s-abcdef.kv"
    path.write_bytes(join(header, body, recompute_crc))
    return engine, path


def meta_edit(key, value):
    def edit(header):
        if value is ...:
            del header["__metadata__"][key]
        else:
            header["__metadata__"][key] = value

    return edit


def entry_edit(tensor, key, value):
    def edit(header):
        if value is ...:
            del header[tensor][key]
        else:
            header[tensor][key] = value

    return edit


NUMERIC = ["page_size", "num_layers", "num_kv_heads", "head_dim", "num_tokens", "chunk_bytes"]
BAD_NUMBERS = ["0", "-1", "", " 16", "16 ", "+16", "1e3", "16.0", "0x10", "١٦", "1_6",
               "9" * 30, "nan", "\n16"]  # fmt: skip
BAD_TYPES = [None, 16, 16.0, True, [], {}, ["16"]]

CASES: dict[str, object] = {}
for key in sorted(METADATA_KEYS):
    CASES[f"{key} missing"] = meta_edit(key, ...)
    for i, value in enumerate(BAD_TYPES):
        CASES[f"{key} of type {type(value).__name__} #{i}"] = meta_edit(key, value)
for key in NUMERIC:
    for i, value in enumerate(BAD_NUMBERS):
        if key == "num_tokens" and value == "0":
            continue  # zero tokens is a valid count (refused as not matching the shapes)
        CASES[f"{key}={value!r} #{i}"] = meta_edit(key, value)
CASES["num_tokens='0'"] = meta_edit("num_tokens", "0")
CASES["num_tokens one page less"] = meta_edit("num_tokens", "16")
CASES["num_tokens one more"] = meta_edit("num_tokens", "33")
CASES["chunk_bytes='1'"] = meta_edit("chunk_bytes", "1")
CASES["dtype F64"] = meta_edit("dtype", "F64")
CASES["dtype I64"] = meta_edit("dtype", "I64")
CASES["chunk_crc32 not hex"] = meta_edit("chunk_crc32", "zzzzzzzz")
CASES["chunk_crc32 two"] = meta_edit("chunk_crc32", "00000000,00000000")
CASES["chunk_crc32 empty"] = meta_edit("chunk_crc32", "")
CASES["chunk_crc32 trailing comma"] = lambda h: h["__metadata__"].update(
    chunk_crc32=h["__metadata__"]["chunk_crc32"] + ","
)
CASES["an unknown field"] = meta_edit("extra", "1")
CASES["metadata a list"] = lambda h: h.update(__metadata__=[["format", "agentctx-kv-snapshot"]])
CASES["header a list"] = lambda h: [h]
CASES["kv missing"] = lambda h: h.pop("kv")
CASES["token_ids missing"] = lambda h: h.pop("token_ids")
CASES["a third tensor"] = lambda h: h.update(extra=h["token_ids"])
CASES["kv a string"] = lambda h: h.update(kv="F32")
for tensor in ("kv", "token_ids"):
    CASES[f"{tensor} dtype F64"] = entry_edit(tensor, "dtype", "F64")
    CASES[f"{tensor} dtype missing"] = entry_edit(tensor, "dtype", ...)
    for field in ("shape", "data_offsets"):
        CASES[f"{tensor} {field} missing"] = entry_edit(tensor, field, ...)
        for i, value in enumerate([None, "1", [1.0], [True], [-1], [1 << 70], [[1]], {}]):
            CASES[f"{tensor} {field} {value!r} #{i}"] = entry_edit(tensor, field, value)
CASES["kv shape one page more"] = lambda h: h["kv"]["shape"].__setitem__(0, 3)
CASES["kv shape of rank 5"] = lambda h: h["kv"]["shape"].pop()
CASES["kv data_offsets reversed"] = lambda h: h["kv"].update(
    data_offsets=h["kv"]["data_offsets"][::-1]
)
CASES["token_ids before the kv"] = lambda h: h["token_ids"].update(data_offsets=[0, 256])
CASES["token_ids shape of another count"] = lambda h: h["token_ids"].update(shape=[16])


@pytest.mark.parametrize("case", list(CASES))
def test_a_crafted_header_is_refused_in_one_line(made, tmp_path, case):
    # (the checksum is recomputed over the edit, except where the edit is the checksum)
    engine, path = crafted(made, tmp_path, CASES[case], not case.startswith("header_crc32"))
    before = path.read_bytes()
    error = loads_or_refuses(engine, path)
    assert error is not None and path.name in error, error
    assert path.read_bytes() == before


def test_chunk_bytes_zero_is_refused_not_divided_by(made, tmp_path):
    """The red team's file: chunk_bytes "0" with the header checksum recomputed (a
    ZeroDivisionError traceback in `ask -c`)."""
    engine, path = crafted(made, tmp_path, meta_edit("chunk_bytes", "0"))
    with pytest.raises(SnapshotError, match="chunk_bytes is 0, not an integer from 1"):
        load_snapshot(engine, path)


def test_a_header_edited_without_its_checksum_is_refused(made, tmp_path):
    engine, path = crafted(made, tmp_path, meta_edit("num_tokens", "16"), recompute_crc=False)
    assert "header checksum mismatch" in loads_or_refuses(engine, path)


def test_the_untouched_snapshot_restores(made, tmp_path):
    engine, path = crafted(made, tmp_path, lambda h: None)
    assert loads_or_refuses(engine, path) is None
    s = engine.open_session("good", snapshot=str(path))
    assert s.token_ids == made[2] and s.restored_tokens == len(made[2])
    s.close()


@pytest.mark.timeout(60)  # a FIFO once blocked the open forever
@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "socket"])
def test_a_snapshot_path_that_is_not_a_regular_file_is_refused_at_once(made, tmp_path, kind):
    engine = made[0]
    path = tmp_path / "s-abcdef.kv"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        import socket

        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    start = time.monotonic()
    error = loads_or_refuses(engine, path)
    assert time.monotonic() - start < 5
    assert error is not None and ("not a regular file" in error or "cannot open" in error), error


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporary_files_of_killed_writers_are_removed(made, tmp_path):
    engine, data, _ = made
    kv = tmp_path / "kv"
    kv.mkdir()
    target = kv / "s-abcdef.kv"
    target.write_bytes(data)
    dead = _dead_pid()
    stale = kv / f".s-abcdef.kv.{dead}.tmp"
    stale.write_bytes(data[: len(data) // 2])
    other_stale = kv / f".s-123456.kv.{dead}.tmp"
    other_stale.write_bytes(b"x" * 100)
    live = kv / f".s-abcdef.kv.{os.getppid()}.tmp"  # a live process (pytest's parent)
    live.write_bytes(b"x" * 100)
    import_left = kv / f".import-q1w2e3.kv.{dead}.tmp"  # a killed `sessions import`
    import_left.write_bytes(b"x" * 100)
    # restoring one snapshot (the start of `ask -c`) removes its own stale temporaries
    assert loads_or_refuses(engine, target) is None
    assert not stale.exists() and other_stale.exists() and live.exists()
    # saving prunes the folder: every stale temporary goes, a live one counts
    removed = prune(kv, 1 << 30)
    assert set(removed) == {other_stale, import_left}
    assert live.exists() and target.exists()
    # the live writer's 100 bytes count against the budget: the snapshot no longer fits
    assert prune(kv, len(data) + 99) == [target] and live.exists()


def test_a_save_removes_its_own_stale_temporaries(made, tmp_path):
    engine = made[0]
    dead = _dead_pid()
    path = tmp_path / "s-abcdef.kv"
    stale = tmp_path / f".s-abcdef.kv.{dead}.tmp"
    stale.write_bytes(b"half a snapshot")
    write_snapshot(engine, path)
    assert not stale.exists() and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("name", [".s-abcdef.kv.0.tmp", ".s-abcdef.kv.99999999999.tmp"])
def test_impossible_pids_are_stale(tmp_path, name):
    (tmp_path / name).write_bytes(b"x")
    assert [p.name for p in remove_stale_temps(tmp_path)] == [name]


def test_a_stale_name_that_is_not_a_file_is_left_alone(tmp_path):
    (tmp_path / f".s-abcdef.kv.{_dead_pid()}.tmp").mkdir()
    assert remove_stale_temps(tmp_path) == []


# -- through the CLI -----------------------------------------------------------------------


def _agentctx(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentctx", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def cli_home(tmp_path, monkeypatch):
    home = private_home(tmp_path)
    monkeypatch.setenv("AGENTCTX_HOME", str(home))
    return home


@pytest.fixture
def repo(tmp_path):
    from tests.reliability.support import make_repo

    return make_repo(tmp_path / "greeter", {"README.md": "# greeter\n\nSays hello.\n"})


@pytest.mark.slow
def test_ask_continue_over_a_snapshot_with_chunk_bytes_zero(cli_home, repo):
    first = _agentctx("ask", "What is this?", "--repo", str(repo), "--max-tokens", "4")
    assert first.returncode == 0, first.stderr
    (snapshot,) = (cli_home / "kv").glob("s-*.kv")
    header, body = split(snapshot.read_bytes())
    header["__metadata__"]["chunk_bytes"] = "0"
    snapshot.write_bytes(join(header, body))
    again = _agentctx("ask", "-c", "And then?", "--max-tokens", "4")
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    refused = [line for line in again.stderr.splitlines() if "KV snapshot not used" in line]
    assert len(refused) == 1 and "chunk_bytes is 0, not an integer" in refused[0], again.stderr
    assert "prefilling instead" in refused[0]
    with SessionStore(cli_home / "sessions.db") as store:
        assert [m.role for m in store.messages(store.latest().id)][-2:] == ["user", "assistant"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ask_continue_with_a_fifo_at_the_snapshot_path_does_not_hang(cli_home, repo):
    with SessionStore(cli_home / "sessions.db") as store:
        s = store.create(str(repo), "repo", "smollm2-135m")
        store.add_message(s.id, "user", "What is this?")
        store.add_message(s.id, "assistant", "A greeter.")
    (cli_home / "kv").mkdir()
    os.mkfifo(cli_home / "kv" / f"{s.id}.kv")
    proc = _agentctx("ask", "-c", "And then?", "--max-tokens", "4", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"KV snapshot not used: {s.id}.kv is not a regular file" in proc.stderr
