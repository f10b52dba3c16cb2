"""Typing into the TUI as a user does, for the Pilot tests."""

from __future__ import annotations


async def submit(pilot, text: str, wait: bool = False) -> None:
    """Type `text` into the input box and press Enter; with `wait`, until the turn ends."""
    prompt = pilot.app.screen.query_one("#prompt")
    prompt.focus()  # as a user clicks back into it (a click may have moved the focus)
    prompt.value = text
    await pilot.press("enter")
    await pilot.pause()
    if wait:
        await finish(pilot)


async def finish(pilot) -> None:
    """Wait for the running turn's worker, then for the screen to settle."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()
