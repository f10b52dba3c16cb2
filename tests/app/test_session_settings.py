"""Sampling settings: config.json's "sampling" (checked, shown by `config show`), a session's
/set changes stored with it (a store migration; old stores keep their data) and restored on
resume by the TUI and by `ask -c`; command-line flags over both. Real SQLite files, a real
Textual app driven by Pilot, real processes for `config show`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from sqlite_utils import Database

from agentctx.cli import cli
from agentctx.tui.app import AgentApp
from sessions.migrations import applied_migrations, migrate
from sessions.store import SessionStore
from tests.app.test_cli_runner import ScriptedBackend

SIZE = (100, 30)


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("AGENTCTX_HOME", str(home))
    return home


def write_config(home, sampling) -> None:
    (home / "config.json").write_text(json.dumps({"sampling": sampling}))


# -- the store ---------------------------------------------------------------------------


def test_an_old_store_migrates_and_keeps_its_data(tmp_path):
    path = tmp_path / "sessions.db"
    db = Database(path)
    migrate(db, upto="m004_message_search")  # the store as the last release left it
    now = "2025-01-01T00:00:00.000000+00:00"
    db.execute("insert into sessions (id, name, root, root_kind, model, created, updated)"
               " values ('s-000001', 'old', '/old', 'repo', 'm', ?, ?)", [now, now])  # fmt: skip
    db.execute("insert into messages (session_id, seq, role, content, status, created)"
               " values ('s-000001', 1, 'user', 'from the old days', 'complete', ?)", [now])  # fmt: skip
    db.close()
    with SessionStore(path) as store:
        assert applied_migrations(store.db)[-1] == "m005_session_settings"
        s = store.get("old")
        assert s.settings is None and s.message_count == 1 and s.updated == now
        assert store.messages(s.id)[0].content == "from the old days"
        kept = store.session_table.set_settings("old", {"temperature": 0.5, "seed": None})
        assert kept.settings == {"temperature": 0.5, "seed": None}
        assert kept.updated == now  # a setting is not a use: -c picks the same session
    with SessionStore(path) as again:
        assert again.get("old").settings == {"temperature": 0.5, "seed": None}


def test_settings_travel_in_a_session_file(tmp_path):
    import io

    from sessions.session_file import export_session, import_session

    with SessionStore(tmp_path / "a.db") as a, SessionStore(tmp_path / "b.db") as b:
        sid = a.create("/r/calc", "repo", "m").id
        a.session_table.set_settings(sid, {"top_k": 40, "seed": None})
        plain = a.create("/r/calc", "repo", "m").id  # none set: none come back
        for ref, settings in ((sid, {"top_k": 40, "seed": None}), (plain, None)):
            text = io.StringIO()
            export_session(a, ref, text)
            assert import_session(b, io.StringIO(text.getvalue())).settings == settings


# -- the TUI -----------------------------------------------------------------------------


def tui(store, **kw) -> AgentApp:
    return AgentApp(repo="/r/calc", engine_factory=lambda m: None, store=store, **kw)


async def slash(pilot, text: str) -> None:
    prompt = pilot.app.screen.query_one("#prompt")
    prompt.focus()
    prompt.value = text
    await pilot.press("enter")
    await pilot.pause()


@pytest.mark.anyio
async def test_set_is_stored_with_the_session_and_comes_back_on_resume(home, tmp_path):
    write_config(home, {"temperature": 0.2, "top_k": 40})
    with SessionStore(tmp_path / "s.db") as store:
        sid = store.create("/r/calc", "repo", "smollm2-135m").id
        async with tui(store, resume=sid).run_test(size=SIZE) as pilot:
            app = pilot.app
            await pilot.pause()
            assert (app.params.temperature, app.params.top_k) == (0.2, 40)  # config.json
            await slash(pilot, "/set temperature 0.9")
            await slash(pilot, "/set steps 2")
            await slash(pilot, "/set seed 5")
        assert store.get(sid).settings == {"temperature": 0.9, "max_steps": 2, "seed": 5}
        async with tui(store, resume=sid).run_test(size=SIZE) as pilot:  # as tui -c opens it
            app = pilot.app
            await pilot.pause()
            assert app.session.id == sid
            assert (app.params.temperature, app.params.seed, app.max_steps) == (0.9, 5, 2)
            assert app.params.top_k == 40  # config.json's, under the session's
            await slash(pilot, "/new")  # a new session starts from the config's settings
            assert (app.params.temperature, app.params.seed, app.max_steps) == (0.2, None, 6)
            await slash(pilot, "/sessions")
            await pilot.press("enter")  # resumed from the list
            await pilot.pause()
            assert app.session.id == sid and app.params.temperature == 0.9


@pytest.mark.anyio
async def test_settings_stored_in_a_bad_shape_are_not_used(home, tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = store.create("/r/calc", "repo", "smollm2-135m").id
        store.session_table.set_settings(sid, {"top_p": 7})
        async with tui(store, resume=sid).run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert pilot.app.params.top_p == 1.0
            assert pilot.app.session.id == sid


# -- config.json -------------------------------------------------------------------------


def agentctx(home, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTCTX_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "agentctx", *args], capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip


def test_config_show_prints_the_sampling_settings_in_effect(home):
    write_config(home, {"temperature": 0.7, "max_tokens": 256, "repeat_penalty": 1.3})
    shown = agentctx(home, "config", "show")
    assert shown.returncode == 0, shown.stderr
    assert ("# sampling in effect: temperature 0.7 · top_p 1.0 · top_k 0 · max_tokens 256 · "
            "repeat_penalty 1.3 · seed None · steps 6") in shown.stdout  # fmt: skip


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"top_p": 2}, '"sampling": top_p must be in (0, 1], not 2.0'),
        ({"max_tokens": "many"}, '"sampling": max_tokens must be a whole number'),
        ({"temprature": 0.1}, '"sampling": unknown option temprature'),
        ([0.7], '"sampling" must be an object of settings'),
    ],
)
def test_a_bad_sampling_value_is_one_error_line(home, sampling, message):
    write_config(home, sampling)
    for args in (("config", "show"), ("ask", "--dry-run", "q"), ("tui",)):
        out = agentctx(home, *args)
        assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
        (line,) = out.stderr.splitlines()
        assert line.startswith("agentctx: error: bad config ") and message in line, line


# -- ask: flags over the session's settings over config.json -----------------------------


class RecordingBackend(ScriptedBackend):
    def run(self, turn, output, links):
        self.used = (turn.params, turn.max_steps)
        return super().run(turn, output, links)


def ask(backend, *args):
    result = CliRunner().invoke(cli, ["ask", *args], obj={"load_backend": backend.load})
    assert result.exit_code == 0, result.output
    return backend.used


def test_ask_takes_config_then_the_sessions_settings_then_flags(home, repo):
    root = repo
    write_config(home, {"temperature": 0.3, "max_tokens": 50, "top_p": 0.8})
    backend = RecordingBackend([("one", "stop")] * 4)
    params, steps = ask(backend, "What does add do?", "--repo", str(root))
    assert (params.temperature, params.max_tokens, params.top_p, steps) == (0.3, 50, 0.8, 6)
    with SessionStore(home / "sessions.db") as store:
        store.session_table.set_settings(store.latest().id, {"temperature": 0.9, "max_steps": 1})
    params, steps = ask(backend, "-c", "And subtract?")
    assert (params.temperature, params.max_tokens, params.top_p, steps) == (0.9, 50, 0.8, 1)
    params, steps = ask(backend, "-c", "Again", "--temperature", "0", "--max-steps", "3")
    assert (params.temperature, params.max_tokens, steps) == (0.0, 50, 3)
    params, _ = ask(backend, "A new one", "--repo", str(root), "--max-tokens", "9")
    assert (params.temperature, params.max_tokens) == (0.3, 9)  # a new session: no /set


@pytest.mark.anyio
async def test_set_before_the_first_question_is_stored_with_its_session(tmp_path, repo):
    from engine import Engine

    engine = Engine.load(None, device="cpu")  # SmolLM2 (the tests' AGENTCTX_HOME config)
    with SessionStore(tmp_path / "s.db") as store:
        app = AgentApp(repo=str(repo), engine_factory=lambda m: engine, store=store)
        async with app.run_test(size=SIZE) as pilot:
            await slash(pilot, "/set max_tokens 4")
            await slash(pilot, "What is 2 + 2?")
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
            assert app.session is not None
        assert store.get(app.session.id).settings == {"max_tokens": 4}
