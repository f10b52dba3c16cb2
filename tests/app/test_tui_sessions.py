"""The TUI's session list, driven with Pilot over a real SessionStore file: what each row
shows, the current session's mark, and the `/` filter."""

from __future__ import annotations

import pytest

from agentctx.tui.app import AgentApp
from agentctx.tui.screens import ChatScreen, ConfirmScreen, RenameScreen, SessionsScreen
from sessions.store import SessionStore

SIZE = (110, 30)
pytestmark = pytest.mark.anyio


@pytest.fixture
def store(tmp_path):
    with SessionStore(tmp_path / "sessions.db") as s:
        calc = s.create("/r/calc", "repo", "smollm2-135m")
        s.add_message(calc.id, "system", "You answer questions.")
        packed = "Repository files:\n\ncalc.py\ndef add(a, b): ...\n\nQuestion: What does add do?"
        s.add_message(calc.id, "user", packed)
        s.add_message(calc.id, "assistant", "It adds.")
        s.add_message(calc.id, "user", "And subtract?")
        s.add_message(calc.id, "assistant", "There is none.")
        s.create("/r/kvstore", "repo", "qwen2.5-coder-0.5b", name="dr-notes")
        book = s.create("/b/moby.txt", "book", "smollm2-135m")
        s.add_message(book.id, "user", "Book chapters:\n\n...\n\nQuestion: Who is Ahab?")
        yield s


def rows(app) -> list[list[str]]:
    table = app.screen.query_one("#sessions")
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def open_list(pilot) -> None:
    prompt = pilot.app.screen.query_one("#prompt")
    prompt.value = "/sessions"
    await pilot.press("enter")
    await pilot.pause()
    assert isinstance(pilot.app.screen, SessionsScreen)


async def test_rows_show_title_reads_model_turns_and_mark_the_current_one(store):
    calc = store.list(search="add do")[0]
    app = AgentApp(repo="/r/calc", engine_factory=lambda m: None, store=store, resume=calc.id)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.session.id == calc.id
        await open_list(pilot)
        by_id = {r[-1]: r for r in rows(app)}
        assert by_id[calc.id][:5] == ["●", "What does add do?", "calc", "smollm2-135m", "2"]
        assert by_id[calc.id][5] == calc.updated[:16].replace("T", " ")
        others = [r for r in by_id.values() if r[-1] != calc.id]
        assert {r[0] for r in others} == {""}  # only the current session is marked
        assert {tuple(r[1:5]) for r in others} == {
            ("dr-notes", "kvstore", "qwen2.5-coder-0.5b", "0"),
            ("Who is Ahab?", "book: moby.txt", "smollm2-135m", "1"),
        }


async def test_slash_filters_by_title_name_and_repository(store):
    app = AgentApp(repo="/r/calc", engine_factory=lambda m: None, store=store)
    async with app.run_test(size=SIZE) as pilot:
        await open_list(pilot)
        assert len(rows(app)) == 3
        await pilot.press("slash", "d", "r")  # r and d are typed, not rename / delete
        await pilot.pause()
        assert not isinstance(app.screen, (ConfirmScreen, RenameScreen))
        assert [r[1] for r in rows(app)] == ["dr-notes"]
        box = app.screen.query_one("#filter")
        box.value = "AHAB"  # a title, any case
        await pilot.pause()
        assert [r[1] for r in rows(app)] == ["Who is Ahab?"]
        box.value = "calc"  # the repository
        await pilot.pause()
        assert [r[1] for r in rows(app)] == ["What does add do?"]
        await pilot.press("enter")  # to the rows: Enter there resumes the one shown
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)
        assert app.session.first_question == "What does add do?"
        await open_list(pilot)
        await pilot.press("slash", "z", "z", "z")
        await pilot.pause()
        assert rows(app) == []
        await pilot.press("escape")  # clears the filter, stays on the list
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen) and len(rows(app)) == 3
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)
