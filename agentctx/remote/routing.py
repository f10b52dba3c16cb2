"""Session affinity across replicas: each session goes to the same replica every turn, so the
prefix cache there holds its conversation.

Rendezvous (highest random weight) hashing: a session's replicas are ordered by a hash of
(session id, URL); the first that answers takes the session. A replica that fails (a
connection error) is skipped, and its sessions, only its, move to their next choice; adding
or removing a replica moves only the sessions whose first choice it becomes or was."""

from __future__ import annotations

import hashlib


def affinity(session_id: str, url: str) -> int:
    digest = hashlib.blake2b(f"{session_id}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Replicas:
    """The URLs of one backend, and those found down in this process."""

    def __init__(self, urls: list[str]) -> None:
        unique = list(dict.fromkeys(urls))
        if not unique:
            raise ValueError("a backend needs at least one URL")
        self.urls = tuple(unique)
        self.down: set[str] = set()

    def order(self, session_id: str) -> list[str]:
        """Every replica, the session's first choice first."""
        return sorted(self.urls, key=lambda url: (-affinity(session_id, url), url))

    def candidates(self, session_id: str) -> list[str]:
        """The replicas to try for the session, in order: those not found down first (all
        of them when every one was: a replica may have come back)."""
        ordered = self.order(session_id)
        up = [url for url in ordered if url not in self.down]
        return up + [url for url in ordered if url in self.down]

    def failed(self, url: str) -> None:
        self.down.add(url)

    def answered(self, url: str) -> None:
        self.down.discard(url)
