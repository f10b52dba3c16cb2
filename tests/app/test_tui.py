"""The TUI driven as a user would, with Pilot: the real default model (loaded once), a real
SessionStore on a temporary file and a tiny git repository."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from textual.widgets._collapsible import CollapsibleTitle

from agentctx.tui.app import AgentApp
from agentctx.tui.screens import ChatScreen, ConfirmScreen, SessionsScreen
from agentctx.tui.widgets import (
    AssistantMessage,
    ContextMeter,
    LogLine,
    ToolCallPanel,
    UserMessage,
)
from engine import Engine, SamplingParams
from sessions.models import Session
from sessions.store import SessionStore
from tests.app.pilot_support import finish, submit

SIZE = (100, 30)
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def engine(agentctx_home):
    # agentctx_home (tests/conftest.py) has set AGENTCTX_HOME before this loads the model
    assert os.environ["AGENTCTX_HOME"] == str(agentctx_home)
    return Engine.load(None, device="cpu")


def make_app(engine, repo, store, max_tokens=16, **kw) -> AgentApp:
    params = SamplingParams(max_tokens=max_tokens, **kw)
    return AgentApp(repo=str(repo), engine_factory=lambda model: engine, store=store, params=params)


def texts(app, cls) -> list[str]:
    out = []
    for w in app.screen.query(cls):
        out.append(w.text if isinstance(w, AssistantMessage) else str(w.render()))
    return out


async def test_ask_streams_and_stores_the_turn(engine, repo, store):
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "What does add do?")
        await finish(pilot)
        assert not app.busy
        answers = texts(app, AssistantMessage)
        assert len(answers) == 1 and answers[0].strip()
        meter = str(app.screen.query_one(ContextMeter).render())
        assert "context " in meter and "context —" not in meter and "/ 8,192 tokens" in meter
        roles = [m.role for m in store.messages(app.session.id)]
        assert roles == ["system", "user", "assistant"]
        assert store.messages(app.session.id)[-1].status == "complete"
        # /context shows the packed files of this session
        await submit(pilot, "/context")
        assert "calc.py" in texts(app, AssistantMessage)[-1]


async def test_escape_cancels_and_keeps_the_partial_answer(engine, repo, store):
    app = make_app(engine, repo, store, max_tokens=4000, ignore_eos=True)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "Explain calc.py at length.")
        for _ in range(400):
            if app.streaming:
                break
            await asyncio.sleep(0.02)
        assert app.streaming
        await submit(pilot, "A second question")  # typed while the answer runs: kept
        prompt = app.screen.query_one("#prompt")
        assert prompt.value == "A second question" and app.busy
        assert "stays in the box" in texts(app, LogLine)[-1]
        await pilot.press("escape")
        await finish(pilot)
        assert not app.busy
        last = store.messages(app.session.id)[-1]
        assert last.role == "assistant" and last.status == "interrupted"
        assert (last.tokens or 0) < 4000
        assert any("interrupted" in t for t in texts(app, LogLine))
        # still responsive
        prompt.value = ""
        await submit(pilot, "/help")
        assert "/sessions" in texts(app, AssistantMessage)[-1]


async def test_the_turn_is_stored_while_the_answer_streams(engine, repo, store):
    """Question first, then the answer as it grows: a TUI killed mid-answer leaves both."""
    app = make_app(engine, repo, store, max_tokens=4000, ignore_eos=True)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "Explain calc.py at length.")
        for _ in range(400):
            if app.streaming:
                break
            await asyncio.sleep(0.02)
        assert app.streaming
        seen = None
        for _ in range(300):  # the partial answer reaches the store within a second or so
            session = store.latest()
            last = store.messages(session.id)[-1] if session is not None else None
            if last is not None and last.role == "assistant" and last.content:
                seen = (session.id, last)
                break
            await asyncio.sleep(0.02)
        assert app.busy and seen is not None  # (still answering)
        session_id, last = seen
        assert last.status == "interrupted"
        roles = [m.role for m in store.messages(session_id)]
        assert roles == ["system", "user", "assistant"]
        await pilot.press("escape")
        await finish(pilot)
        assert app.session.id == session_id and len(store.list()) == 1
        final = store.messages(session_id)
        assert [m.role for m in final] == roles  # the same rows, finished
        assert final[-1].status == "interrupted" and final[-1].content.startswith(last.content)


async def test_resume_from_the_session_list_and_follow_up(engine, repo, store):
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "What does add do?")
        await finish(pilot)
        sid = app.session.id
        await submit(pilot, "/new")
        assert app.session is None and not texts(app, UserMessage)
        await submit(pilot, "/sessions")
        assert isinstance(app.screen, SessionsScreen)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen) and app.session.id == sid
        assert texts(app, UserMessage) == ["What does add do?"]
        assert len(texts(app, AssistantMessage)) == 1
        await submit(pilot, "And the README?")
        await finish(pilot)
        assert app.session.id == sid
        msgs = store.messages(sid)
        assert [m.role for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
        assert msgs[3].content == "And the README?"
        assert len(store.list()) == 1


async def test_session_list_rename_and_delete(engine, repo, store):
    a = store.create(str(repo), "repo", "default", name="first")
    store.create(str(repo), "repo", "default", name="second")
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "/sessions")
        await pilot.press("r")
        await pilot.pause()
        app.screen.query_one("#name").value = "renamed"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)
        assert {s.name for s in store.list()} == {"first", "renamed"}
        for keep in ("n", "escape"):  # asked first: n or Esc keeps the session
            await pilot.press("d")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press(keep)
            await pilot.pause()
            assert isinstance(app.screen, SessionsScreen)
            assert len(store.list()) == 2
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)
        assert [s.id for s in store.list()] == [a.id]


async def test_slash_commands(engine, repo, store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "/help")
        help_text = texts(app, AssistantMessage)[-1]
        for cmd in ("/new", "/sessions", "/repo", "/book", "/export", "/model", "/context"):
            assert cmd in help_text
        await submit(pilot, "/repo /no/such/dir")
        assert "does not exist" in texts(app, LogLine)[-1]
        assert app.repo == str(repo)
        await submit(pilot, "/frobnicate")
        assert "unknown command /frobnicate" in texts(app, LogLine)[-1]
        await submit(pilot, "/book novel.txt")
        assert "book not found" in texts(app, LogLine)[-1]
        assert app.kind == "repo"
        await submit(pilot, "/export")
        assert "nothing to export" in texts(app, LogLine)[-1]
        await submit(pilot, "/new")
        assert not app.screen.query("#log > *")
        await submit(pilot, "hi")
        await finish(pilot)
        await submit(pilot, "/export")
        path = tmp_path / f"{app.session.id}.jsonl"
        assert path.exists() and str(path) in texts(app, LogLine)[-1]


async def test_book_session(engine, repo, store, tmp_path):
    book = tmp_path / "tale.txt"
    book.write_text("A Tale\n\nChapter 1\n\nTom had a red boat named Swift.\n")
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, f"/book {book}")
        assert "read the book" in texts(app, LogLine)[-1]
        await submit(pilot, "What was the boat called?")
        await finish(pilot)
        assert any("chapters" in t for t in texts(app, LogLine))
    session = store.latest()
    assert session.root_kind == "book" and session.root == str(book.resolve())
    assert "Swift" in store.messages(session.id)[1].content


async def test_tool_calls_show_as_collapsible_panels_and_come_back_on_resume(repo, store):
    import json

    from textual.widgets import Collapsible
    from transformers import AutoTokenizer

    from engine.loading.loader import resolve_source
    from tests.app.scripted import ScriptedEngine
    from tests.app.tool_templates import HERMES

    read = {"name": "read_file", "arguments": {"path": "calc.py"}}
    tok = AutoTokenizer.from_pretrained(resolve_source(None).path)
    scripted = ScriptedEngine(tok, HERMES, [
        f"<tool_call>{json.dumps(read)}</tool_call>",
        "add returns a + b (calc.py:2).",
    ])  # fmt: skip
    app = AgentApp(repo=str(repo), engine_factory=lambda model: scripted, store=store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "What does add return?")
        await finish(pilot)
        panels = list(app.screen.query(ToolCallPanel))
        assert len(panels) == 1 and panels[0].collapsed
        assert "read_file(path='calc.py')" in str(panels[0].title)
        assert texts(app, AssistantMessage) == ["add returns a + b (calc.py:2)."]
        await pilot.click(CollapsibleTitle)
        await pilot.pause()
        assert not panels[0].collapsed
        assert "return a + b" in str(panels[0].query_one(".tool-output").render())
        sid = app.session.id
        (stored,) = store.tool_calls(sid)
        assert stored.name == "read_file" and "return a + b" in stored.result
        await submit(pilot, "/new")
        await pilot.pause()
        assert len(app.screen.query(Collapsible)) == 0
        app.resume(sid)
        await pilot.pause()
        assert len(app.screen.query(ToolCallPanel)) == 1


async def test_set_changes_sampling_options(engine, repo, store):
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "/set")
        assert "temperature 0.0" in texts(app, LogLine)[-1]
        await submit(pilot, "/set temperature 0.7")
        await submit(pilot, "/set max-tokens 32")
        await submit(pilot, "/set steps 2")
        assert (app.params.temperature, app.params.max_tokens, app.max_steps) == (0.7, 32, 2)
        await submit(pilot, "/set top_p 2")
        assert "top_p must be in (0, 1]" in texts(app, LogLine)[-1] and app.params.top_p == 1.0
        await submit(pilot, "/set temperature warm")
        assert "could not convert" in texts(app, LogLine)[-1]
        await submit(pilot, "/set bogus 1")
        assert "unknown option bogus" in texts(app, LogLine)[-1]
        await submit(pilot, "/set seed 7")
        assert app.params.seed == 7
        await submit(pilot, "/set seed none")  # back to random
        assert app.params.seed is None and texts(app, LogLine)[-1] == "seed = none"


async def test_resume_goes_on_with_the_sessions_model(repo, store):
    loaded = []
    other = store.create(str(repo), "repo", "my/other-model")
    app = AgentApp(repo=str(repo), engine_factory=loaded.append, store=store)
    async with app.run_test(size=SIZE) as pilot:
        app.resume(other.id)
        await pilot.pause()
        assert app.model == "my/other-model" and app.engine is None
        assert "my/other-model" in texts(app, LogLine)[-1]


async def test_closing_saves_the_kv_and_resuming_restores_it(
    engine, repo, store, monkeypatch, tmp_path
):
    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path / "home"))  # kv/ goes here
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "What does add do?")
        await finish(pilot)
        sid = app.session.id
        pinned = app.turns.conversation.es.num_cached_tokens
        assert pinned > 0
    # the app closed: its session's KV went to a snapshot and its pages were unpinned
    assert (tmp_path / "home" / "kv" / f"{sid}.kv").is_file()
    assert not engine.sessions
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        app.resume(sid)
        await pilot.pause()
        await submit(pilot, "And subtract?")
        await finish(pilot)
        assert any(f"restored {pinned:,} tokens of KV" in t for t in texts(app, LogLine))
        msgs = store.messages(sid)
        # at least turn 1's prompt came from the file (its answer too, unless re-encoding
        # its text gives other tokens than the model generated)
        assert msgs[-1].timings["cached_tokens"] >= msgs[2].timings["prompt_tokens"] // 16 * 16


async def test_a_new_session_saves_the_last_ones_kv_off_the_main_thread(
    engine, repo, store, monkeypatch, tmp_path
):
    """The snapshot is torch work: on the main thread it would start an OpenMP pool there
    for the app's lifetime, and every later turn would decode at about half speed."""
    import threading

    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path / "home"))
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "What does add do?")
        await finish(pilot)
        sid, close, seen = app.session.id, app.turns.conversation.close, []
        monkeypatch.setattr(app.turns.conversation, "close",
                            lambda output: (seen.append(threading.current_thread()),
                                            close(output)))  # fmt: skip
        app.new_session()
        await pilot.pause()
        assert seen and threading.main_thread() not in seen
    assert (tmp_path / "home" / "kv" / f"{sid}.kv").is_file()


async def test_meter_shows_tokens_on_the_gpu_and_on_the_host(repo, store):
    import re

    from engine.config import EngineConfig
    from engine.kv import SparseConfig

    # (a Forecast under the timed policy: these steps need next to nothing from the host,
    # so it does not prefetch, and the meter says so)
    cfg = SparseConfig(budget_fraction=0.25, forecast="free", prefetch_policy="timed")
    sparse = Engine.load(None, device="cpu", config=EngineConfig(sparse=cfg))
    app = AgentApp(repo=str(repo), engine_factory=lambda model: sparse, store=store,
                   params=SamplingParams(max_tokens=8))  # fmt: skip
    async with app.run_test(size=SIZE) as pilot:
        meter = str(app.screen.query_one(ContextMeter).render())
        assert "on GPU" not in meter  # nothing yet
        await submit(pilot, "What does add do?")
        await finish(pilot)
        meter = str(app.screen.query_one(ContextMeter).render())
        assert " · prefetch off  │  " in meter, meter  # (the session label comes last)
        gpu, host = re.search(r"on GPU ([\d,]+) · on host ([\d,]+)", meter).groups()
        assert int(host.replace(",", "")) > 0 and int(gpu.replace(",", "")) > 0
        usage = store.messages(app.session.id)[-1].timings
        assert usage["selected_pages_per_step"] > 0 and 0 <= usage["fetch_fraction"] <= 1
        assert usage["prefetch"]["policy"] == "timed" and not usage["prefetch"]["on"]


# -- snapshots (deterministic: no model run, fixed store contents) -----------------------


class FixedStore:
    """Stands in for SessionStore where only the listing is read."""

    def list(self, limit=None):
        return [
            Session("s-aaaaaa", "calc-notes", "/r/calc", "repo", "default",
                    "2025-01-02T10:00:00", "2025-01-02T10:05:00", None, 5),
            Session("s-bbbbbb", None, "/r/calc", "repo", "default",
                    "2025-01-01T09:00:00", "2025-01-01T09:01:00", None, 3),
        ]  # fmt: skip


def test_snapshot_empty_chat(snap_compare, tmp_path):
    app = AgentApp(repo=str(tmp_path / "calc"), engine_factory=lambda m: None, store=FixedStore())
    assert snap_compare(app, terminal_size=SIZE)


def test_snapshot_session_list(snap_compare, tmp_path):
    app = AgentApp(repo=str(tmp_path / "calc"), engine_factory=lambda m: None, store=FixedStore())
    assert snap_compare(
        app, terminal_size=SIZE, press=["/", "s", "e", "s", "s", "i", "o", "n", "s", "enter"]
    )


async def test_session_names_with_markup_are_shown_as_text(engine, repo, store):
    store.create(str(repo), "repo", "default", name="[/]")  # Rich markup: it crashed the list
    store.create(str(repo), "repo", "default", name="[bold red]x")
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "/sessions")
        assert isinstance(app.screen, SessionsScreen)
        table = app.screen.query_one("DataTable")
        names = {str(table.get_row_at(i)[1]) for i in range(table.row_count)}
        assert names == {"[/]", "[bold red]x"}


async def test_a_session_deleted_elsewhere_starts_a_new_one(engine, repo, store, tmp_path):
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "What does add do?")
        await finish(pilot)
        gone = app.session.id
        with SessionStore(store.path) as other:  # another agentctx deletes it
            other.delete(gone)
        await submit(pilot, "/context")
        assert "cannot be read any more" in texts(app, LogLine)[-1] and app.session is None
        await submit(pilot, "What does multiply do?")  # the app goes on, in a new session
        await finish(pilot)
        assert app.session is not None and app.session.id != gone


async def test_export_never_replaces_a_users_file_and_odd_paths_are_refused(
    engine, repo, store, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    app = make_app(engine, repo, store)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "hi")
        await finish(pilot)
        mine = tmp_path / f"{app.session.id}.jsonl"
        mine.write_text("USER DATA\n")
        await submit(pilot, "/export")
        assert "not an earlier export" in texts(app, LogLine)[-1]
        assert mine.read_text() == "USER DATA\n" and not list(tmp_path.glob(".*.tmp"))
        for command in ("/repo ~nosuchuser_agentctx/x", "/repo /tmp/" + "a" * 300, "/repo /proc",
                        "/book ~nosuchuser_agentctx/x", "/book /tmp/" + "b" * 300):  # fmt: skip
            await submit(pilot, command)
            assert texts(app, LogLine)[-1].startswith(("/repo: ", "/book: ")), command
        await submit(pilot, "/set max_tokens 99999")
        assert "less than the model's" in texts(app, LogLine)[-1]
        assert app.params.max_tokens == 16


async def test_a_turn_the_locked_store_refused_is_stored_before_the_next(engine, repo, tmp_path):
    import sqlite3

    path = tmp_path / "locked.db"
    with SessionStore(path, busy_timeout_ms=200) as store:
        app = make_app(engine, repo, store)
        async with app.run_test(size=SIZE) as pilot:
            await submit(pilot, "What does add do?")
            await finish(pilot)
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("begin immediate")  # another agentctx writing
            await submit(pilot, "And multiply?")
            await finish(pilot)
            assert "it is kept" in " ".join(texts(app, LogLine))
            await submit(pilot, "And subtract?")  # still locked: not asked, nothing lost
            assert "not stored yet" in texts(app, LogLine)[-1]
            other.execute("rollback")
            other.close()
            await submit(pilot, "And subtract?")
            await finish(pilot)
            users = [m.content for m in store.messages(app.session.id) if m.role == "user"]
            assert [u.rsplit("Question: ", 1)[-1] for u in users] == [
                "What does add do?", "And multiply?", "And subtract?"
            ]  # fmt: skip


async def test_an_answer_cut_by_max_tokens_ends_with_a_marker(engine, repo, store):
    app = make_app(engine, repo, store, max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "What does add do?")
        await finish(pilot)
        usage = store.messages(app.session.id)[-1].timings
        assert usage["completion_tokens"] == 4  # the tiny model does not stop by itself in 4
        assert "[the answer was cut at 4 tokens, the max_tokens limit" in texts(app, LogLine)[-1]


async def test_export_writes_to_the_path_given(engine, repo, store, tmp_path):
    app = make_app(engine, repo, store)
    folder = tmp_path / "exports"
    folder.mkdir()
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "What does add do?")
        await finish(pilot)
        await submit(pilot, f"/export {tmp_path / 'talk.md'}")
        assert str(tmp_path / "talk.md") in texts(app, LogLine)[-1]
        await submit(pilot, f"/export {folder}")
        jsonl = folder / f"{app.session.id}.jsonl"
        assert str(jsonl) in texts(app, LogLine)[-1]
        await submit(pilot, f"/export {tmp_path / 'no' / 'such' / 'x.md'}")
        assert "export failed: no folder" in texts(app, LogLine)[-1]
        answer = texts(app, AssistantMessage)[-1]
    md = (tmp_path / "talk.md").read_text()
    assert md.startswith("# ") and "## You\n\nWhat does add do?" in md
    assert "<summary>packed context" in md and answer.strip()[:20] in md
    assert json.loads(jsonl.read_text().splitlines()[0])["format"]


async def test_the_app_opens_the_session_it_was_asked_to_resume(engine, repo, store):
    s = store.create(str(repo), "repo", "default", name="earlier")
    store.add_message(s.id, "user", "packed files\nQuestion: What does add do?")
    store.add_message(s.id, "assistant", "It adds two numbers.")
    params = SamplingParams(max_tokens=8)
    app = AgentApp(repo=str(repo), engine_factory=lambda model: engine, store=store,
                   params=params, resume=s.id)  # fmt: skip
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.session is not None and app.session.id == s.id
        assert any("It adds two numbers." in t for t in texts(app, AssistantMessage))
        await submit(pilot, "And sub?")
        await finish(pilot)
    roles = [m.role for m in store.messages(s.id)]
    assert roles[:2] == ["user", "assistant"] and roles[-2:] == ["user", "assistant"]
    assert len(store.list()) == 1  # the follow-up went into the resumed session
