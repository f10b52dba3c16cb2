"""Screenshots of the TUI for the docs, taken headless with Pilot: the chat mid-stream, the
context meter after a turn (cancelled with Esc, the partial answer kept) and the session list.

    .venv/bin/python scripts/tui_screenshots.py docs/screenshots
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

SIZE = (110, 34)


async def main(out: Path) -> None:
    from agentctx.tui.app import AgentApp
    from engine import Engine, SamplingParams
    from sessions.store import SessionStore

    out.mkdir(parents=True, exist_ok=True)
    engine = Engine.load(None, device="cpu")
    repo = Path(__file__).resolve().parents[1] / "tools"
    with tempfile.TemporaryDirectory() as tmp, SessionStore(Path(tmp) / "sessions.db") as store:
        app = AgentApp(
            repo=str(repo),
            engine_factory=lambda model: engine,
            store=store,
            params=SamplingParams(max_tokens=200, ignore_eos=True),
        )
        async with app.run_test(size=SIZE) as pilot:
            pilot.app.screen.query_one("#prompt").value = "What does grep.py do? Cite lines."
            await pilot.press("enter")
            # wait until the answer is streaming, then take the mid-stream shot
            for _ in range(600):
                await pilot.pause(0.1)
                answers = [w for w in app.screen.query("AssistantMessage")]
                if answers and len(answers[-1].text) > 120:
                    break
            app.save_screenshot(str(out / "chat-mid-stream.svg"))
            await pilot.press("escape")
            await pilot.app.workers.wait_for_complete()
            await pilot.pause(0.5)
            app.save_screenshot(str(out / "context-meter.svg"))  # the meter after the turn
            pilot.app.screen.query_one("#prompt").value = "/sessions"
            await pilot.press("enter")
            await pilot.pause(0.5)
            app.save_screenshot(str(out / "session-list.svg"))
    print(f"wrote chat-mid-stream.svg, context-meter.svg and session-list.svg in {out}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots")))
