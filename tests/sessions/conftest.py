from __future__ import annotations

import pytest

from sessions.store import SessionStore


@pytest.fixture
def store(tmp_path):
    with SessionStore(tmp_path / "sessions.db") as store:
        yield store
