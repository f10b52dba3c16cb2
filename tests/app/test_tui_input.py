"""The chat's input box, driven with Pilot: several lines, history across restarts, Tab
completion. Turns run on a scripted engine (tests/app/scripted.py: the real tokenizer and
chat template, scripted replies) over a real SessionStore and a real git repository."""

from __future__ import annotations

import pytest
from textual import events

from agentctx.tui.app import AgentApp
from agentctx.tui.completion import complete
from agentctx.tui.input_history import InputHistory
from agentctx.tui.widgets import AssistantMessage, UserMessage
from tests.app.scripted import ScriptedEngine

SIZE = (100, 30)
pytestmark = pytest.mark.anyio


def make_app(tokenizer, repo, store, replies=("It adds.",), **kw) -> AgentApp:
    from tests.app.tool_templates import HERMES

    scripted = ScriptedEngine(tokenizer, HERMES, list(replies))
    return AgentApp(repo=str(repo), engine_factory=lambda model: scripted, store=store, **kw)


async def finish(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def shown_questions(app) -> list[str]:
    return [str(w.render()) for w in app.screen.query(UserMessage)]


async def test_a_pasted_question_keeps_every_line(tokenizer, repo, store):
    app = make_app(tokenizer, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.screen.query_one("#prompt")
        app.post_message(events.Paste("first line\nsecond line"))  # as a terminal pastes
        await pilot.pause()
        assert prompt.value == "first line\nsecond line"
        await pilot.press("enter")
        await finish(pilot)
        assert shown_questions(app) == ["first line\nsecond line"]
        users = [m.content for m in store.messages(app.session.id) if m.role == "user"]
        assert users[0].endswith("first line\nsecond line")
        assert prompt.value == ""


async def test_shift_enter_and_ctrl_j_make_a_new_line_and_enter_sends(tokenizer, repo, store):
    app = make_app(tokenizer, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.screen.query_one("#prompt")
        await pilot.press("a", "shift+enter", "b", "ctrl+j", "c")
        await pilot.pause()
        assert prompt.value == "a\nb\nc" and app.session is None and not app.busy
        assert prompt.size.height == 3  # the box grows with its lines
        await pilot.press("enter")
        await finish(pilot)
        assert shown_questions(app) == ["a\nb\nc"] and app.session is not None


async def test_up_and_down_walk_the_questions_and_they_outlive_a_restart(tokenizer, repo, store):
    app = make_app(tokenizer, repo, store, replies=["It adds.", "It subtracts."])
    async with app.run_test(size=SIZE) as pilot:
        for question in ("What does add do?", "And sub?"):
            app.screen.query_one("#prompt").value = question
            await pilot.press("enter")
            await finish(pilot)
        sid = app.session.id
    # a new TUI resumes the session: Up recalls its questions, newest first
    app = make_app(tokenizer, repo, store, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        prompt = app.screen.query_one("#prompt")
        await pilot.press("d", "r", "a", "f", "t")
        await pilot.press("up")
        assert prompt.value == "And sub?"
        await pilot.press("up")
        assert prompt.value == "What does add do?"
        await pilot.press("up")  # the oldest stays
        assert prompt.value == "What does add do?"
        await pilot.press("down")
        assert prompt.value == "And sub?"
        await pilot.press("down")  # past the newest: what was being typed
        assert prompt.value == "draft"
        # in a box of several lines, Up first moves up a line
        prompt.value = "one\ntwo"
        await pilot.press("up")
        assert prompt.value == "one\ntwo" and prompt.cursor_location[0] == 0
        await pilot.press("up")
        assert prompt.value == "And sub?"


async def test_tab_completes_commands_and_paths(tokenizer, repo, store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "talk-notes.md").write_text("x")
    app = make_app(tokenizer, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.screen.query_one("#prompt")
        cases = [
            ("/he", "/help "),
            ("/ex", "/export "),
            ("/se", "/se"),  # two match: both listed under the box
            ("what does cal", "what does calc.py "),  # under the repository
            ("read RE", "read README.md "),
            ("/export tal", "/export talk-notes.md "),  # a command's path: from here
            ("what about ../../et", "what about ../../et"),  # not out of the repository
            ("no such zzz", "no such zzz"),
            ("/nosuch", "/nosuch"),
        ]
        for typed, completed in cases:
            prompt.value = typed
            await pilot.press("tab")
            await pilot.pause()
            assert prompt.value == completed, typed
            assert prompt.has_focus  # Tab completes; it does not move the focus
        prompt.value = "/se"
        await pilot.press("tab")
        await pilot.pause()
        assert "/sessions" in prompt.border_subtitle and "/set" in prompt.border_subtitle
        await pilot.press("s")
        await pilot.pause()
        assert prompt.border_subtitle == ""


def test_history_keeps_the_draft_and_skips_repeats():
    h = InputHistory(["a", "b", "b", "  "])
    assert h.lines == ["a", "b"]
    assert (h.back("typing"), h.back("b"), h.back("a")) == ("b", "a", None)
    assert (h.forward(), h.forward(), h.forward()) == ("b", "typing", None)
    h.add("c")
    assert h.back("") == "c"


def test_completion_of_odd_input_never_raises(repo):
    for before in ("", " ", "/", "\x00", "a\x00b/c", "~nosuchuser/x", "/export ~nosuchuser/x"):
        complete(before, ["/help", "/export"], str(repo))
    assert complete("calc", ["/help"], None) is None  # a book: no paths
    assert complete("see ca", ["/help"], str(repo)).text == "calc.py "


async def test_help_lists_the_keys(tokenizer, repo, store):
    app = make_app(tokenizer, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        app.screen.query_one("#prompt").value = "/help"
        await pilot.press("enter")
        await pilot.pause()
        (shown,) = [w.text for w in app.screen.query(AssistantMessage)]
        for key in ("Shift-Enter", "Ctrl-J", "Up / Down", "Tab", "Esc", "^s", "^n", "^q", "^p"):
            assert key in shown, key
        assert "theme" in shown and "command palette" in shown


async def test_a_resumed_book_session_recalls_its_question_not_the_book(
    tokenizer, repo, store, tmp_path
):
    book = tmp_path / "tale.txt"
    book.write_text("A Tale\n\nChapter 1\n\nTom had a red boat.\n")
    s = store.create(str(book), "book", "default")
    packed = "Book chapters:\n\nChapter 1\n\nTom had a red boat.\n\nQuestion: Who had a boat?"
    store.add_message(s.id, "user", packed)
    store.add_message(s.id, "assistant", "Tom.")
    app = make_app(tokenizer, repo, store, resume=s.id)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert shown_questions(app) == ["Who had a boat?"]
        await pilot.press("up")
        assert app.screen.query_one("#prompt").value == "Who had a boat?"
