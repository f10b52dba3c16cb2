"""The chat's sampling settings: the app's base (config.json's "sampling" over the built-in
defaults) with the current session's `/set` changes on top. The changes are stored with the
session and come back when it is resumed (tui -c, --session, the session list)."""

from __future__ import annotations

from agentctx.sampling_settings import apply, checked


class SessionSettings:
    def __init__(self, app) -> None:
        self.app = app
        self.base = (app.params, app.max_steps)
        self.changes: dict = {}  # the session's /set changes, as stored

    def set(self, field: str, value) -> None:
        """A /set change: used from the next answer on, stored with the session if it has
        one (else with its first turn). A store that refuses it raises (StoreError)."""
        self.changes[field] = value
        self._apply()
        if self.app.session is not None:
            self.app.sessions.keep_settings(self.app.session.id, self.changes)

    def restore(self, session) -> None:
        """The settings of a resumed session; stored ones that are not valid are left out,
        with a line saying so."""
        try:
            self.changes = checked(session.settings or {}, "its stored settings")
        except ValueError as e:
            self.changes = {}
            self.app.chat.add_line(f"this session's settings are not used: {e}", "error")
        self._apply()

    def reset(self) -> None:
        """A new session starts from the base settings."""
        self.changes = {}
        self._apply()

    def stored(self, session) -> None:
        """A turn has stored the session: the changes made before it go with it."""
        if self.changes and (session.settings or {}) != self.changes:
            self.app.sessions.keep_settings(session.id, self.changes)

    def _apply(self) -> None:
        self.app.params, self.app.max_steps = apply(*self.base, self.changes)
