from __future__ import annotations

import os

import pytest

from sessions.errors import StoreError
from sessions.store import SessionStore


def test_random_bytes_raise_store_error_and_leave_the_file_alone(tmp_path):
    path = tmp_path / "sessions.db"
    data = os.urandom(8192)
    path.write_bytes(data)
    with pytest.raises(StoreError) as e:
        SessionStore(path)
    message = str(e.value)
    assert str(path) in message and "\n" not in message
    assert path.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sessions.db"]


def test_text_file_raises_store_error(tmp_path):
    path = tmp_path / "sessions.db"
    path.write_text("these are my notes, not a database\n" * 100)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="sessions.db"):
        SessionStore(path)
    assert path.read_bytes() == before


def test_directory_in_the_way(tmp_path):
    path = tmp_path / "sessions.db"
    path.mkdir()
    with pytest.raises(StoreError, match="sessions.db"):
        SessionStore(path)
