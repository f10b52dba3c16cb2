"""Session affinity across replicas (agentctx.remote.routing): a session keeps its replica
every turn, moves only when that one fails, and a replica added or removed moves only its
own share of the sessions."""

from __future__ import annotations

from collections import Counter

import pytest

from agentctx.remote.routing import Replicas

URLS = [f"http://gpu{i}:8000/v1" for i in range(4)]
SESSIONS = [f"s-{i:04d}" for i in range(400)]


def first_choices(urls: list[str]) -> dict[str, str]:
    replicas = Replicas(urls)
    return {s: replicas.candidates(s)[0] for s in SESSIONS}


def test_a_session_gets_the_same_replica_every_time_and_in_every_process():
    again = {s: Replicas(list(reversed(URLS))).candidates(s)[0] for s in SESSIONS}
    assert first_choices(URLS) == again  # the order the URLs are listed in does not matter


def test_sessions_spread_over_the_replicas():
    counts = Counter(first_choices(URLS).values())
    assert set(counts) == set(URLS)
    assert min(counts.values()) > len(SESSIONS) / len(URLS) / 2


def test_a_failed_replica_moves_only_its_sessions():
    before = first_choices(URLS)
    replicas = Replicas(URLS)
    replicas.failed(URLS[1])
    after = {s: replicas.candidates(s)[0] for s in SESSIONS}
    moved = {s for s in SESSIONS if before[s] != after[s]}
    assert moved == {s for s in SESSIONS if before[s] == URLS[1]} and moved
    assert URLS[1] not in after.values()
    replicas.answered(URLS[1])  # back: its sessions return to it
    assert {s: replicas.candidates(s)[0] for s in SESSIONS} == before


def test_adding_a_replica_moves_only_the_sessions_it_takes():
    before, after = first_choices(URLS), first_choices([*URLS, "http://gpu4:8000/v1"])
    moved = [s for s in SESSIONS if before[s] != after[s]]
    assert all(after[s] == "http://gpu4:8000/v1" for s in moved)
    assert 0 < len(moved) < len(SESSIONS) / 3


def test_when_every_replica_failed_all_are_tried_again_in_the_sessions_order():
    replicas = Replicas(URLS)
    for url in URLS:
        replicas.failed(url)
    assert replicas.candidates("s-0001") == replicas.order("s-0001")


def test_a_backend_needs_a_url():
    with pytest.raises(ValueError):
        Replicas([])
