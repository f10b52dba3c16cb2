"""`agentctx ask` through click's CliRunner over a scripted backend: the option and error
paths in milliseconds. The backend (a real agentctx.backend.Backend) packs the real
repository with a word count for tokens and answers from its script; the store is a real
SQLite file under a private AGENTCTX_HOME. The end-to-end runs with a model are in
test_cli.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from agentctx import interrupts
from agentctx.ask import TurnResult, first_messages
from agentctx.backend import Backend
from agentctx.cli import cli
from agentctx.packing import pack_repository, summary_line
from agentctx.packing_report import manifest_data
from agentctx.turn_usage import usage_of
from engine.runtime.requests import GenerationStats
from sessions.store import SessionStore
from tools.errors import ToolError


def words(text: str) -> int:
    return len(text.split())


class ScriptedSession:
    """A backend session: what the turns of one stored session share."""

    def __init__(self, session_id: str | None) -> None:
        self.session_id, self.busy, self.closed = session_id, False, False

    def close(self) -> None:
        self.closed = True


class ScriptedBackend(Backend):
    """Answers from `script`, one (text, finish_reason) a turn; a text that is an exception
    is raised instead (after `partial`, for a KeyboardInterrupt, has streamed)."""

    def __init__(self, script: list, window: int = 4096) -> None:
        self.script, self._window = list(script), window
        self.loaded: list[tuple[str, dict]] = []  # (model, options) of each load
        self.opened: list[str | None] = []  # the stored session each backend session is for
        self.prompts: list[list[dict]] = []  # each turn's messages
        self.saved: list[str] = []  # the stored sessions whose KV was kept

    def load(self, model: str, **options) -> ScriptedBackend:
        self.loaded.append((model, options))
        return self

    @property
    def window(self) -> int:
        return self._window

    def pack(self, turn, output, context_tokens=None, show_packing=False):
        packed = pack_repository(turn.root, turn.question, words, context_tokens or 2000)
        with_data = getattr(output, "packing", None)  # (--json: the manifest as data)
        if with_data is not None:
            with_data(summary_line(packed), manifest_data(packed))
        else:
            output.info(summary_line(packed))
        return first_messages(packed, turn.question, turn.kind), packed

    def open_session(self, session, output):
        self.opened.append(session.id if session is not None else None)
        return ScriptedSession(self.opened[-1])

    def run(self, turn, output, links):
        self.prompts.append(list(turn.messages))
        text, reason = self.script.pop(0)
        prompt = sum(words(m["content"]) for m in turn.messages)
        output.prefill(prompt, prompt)
        if isinstance(text, Exception) and not isinstance(text, KeyboardInterrupt):
            raise text
        pieces = (text.partial if isinstance(text, KeyboardInterrupt) else text).split(" ")
        so_far = ""
        for i, piece in enumerate(pieces):
            delta = piece if i == 0 else f" {piece}"
            so_far += delta
            output.text(delta)
            if links.record is not None:
                links.record.stream(lambda s=so_far: s)
        if isinstance(text, KeyboardInterrupt):
            usage = usage_of(None, prompt)
            usage["finish_reason"] = "interrupted"
            text.partial = TurnResult(so_far, "interrupted", usage)
            raise text
        stats = GenerationStats(prompt_tokens=prompt, completion_tokens=len(pieces), ttft_s=0.01)
        usage = usage_of(stats, prompt)
        usage["finish_reason"] = reason
        return TurnResult(text, reason, usage)

    def save_snapshot(self, es, session_id, output) -> None:
        self.saved.append(session_id)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A private AGENTCTX_HOME per test: its store and KV directory."""
    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def ask(backend: ScriptedBackend, *args: str, standalone: bool = True):
    runner = CliRunner()
    return runner.invoke(
        cli, ["ask", *args], obj={"load_backend": backend.load}, standalone_mode=standalone
    )


def stored(home) -> tuple[list, dict]:
    with SessionStore(home / "sessions.db") as store:
        sessions = store.list()
        return sessions, {s.id: store.messages(s.id) for s in sessions}


def test_the_answer_streams_to_stdout_and_the_turn_is_stored(repo, home):
    backend = ScriptedBackend([("add returns a + b.", "stop")])
    result = ask(backend, "What does add do?", "--repo", str(repo), "--model", "tiny")
    assert result.exit_code == 0, result.output
    assert result.stdout == "add returns a + b.\n"
    assert "packed 2 files" in result.stderr and "loading model..." in result.stderr
    ((model, options),) = backend.loaded
    assert model == "tiny" and (options["device"], options["weights"]) == ("auto", "auto")
    (session,), messages = stored(home)
    assert session.model == "tiny" and session.root == str(repo)
    msgs = messages[session.id]
    assert [(m.role, m.status) for m in msgs] == [
        ("system", "complete"), ("user", "complete"), ("assistant", "complete"),
    ]  # fmt: skip
    assert msgs[1].content.endswith("Question: What does add do?")
    assert msgs[-1].content == "add returns a + b." and msgs[-1].tokens == 5
    assert backend.opened == [None] and backend.saved == [session.id]  # the KV is kept


def test_a_follow_up_sends_the_stored_turns_with_the_sessions_model(repo, home):
    backend = ScriptedBackend([("It adds.", "stop"), ("In calc.py.", "stop")])
    assert ask(backend, "What does add do?", "--repo", str(repo), "--model", "m1").exit_code == 0
    result = ask(backend, "Where is it?", "-c")
    assert result.exit_code == 0, result.output
    (session,), messages = stored(home)
    assert backend.loaded[-1][0] == "m1"  # the session's model, not the default
    assert backend.opened == [None, session.id]  # its KV restored from its snapshot
    first, follow = backend.prompts
    assert follow == first + [
        {"role": "assistant", "content": "It adds."}, {"role": "user", "content": "Where is it?"},
    ]  # fmt: skip
    assert [m.content for m in messages[session.id][-2:]] == ["Where is it?", "In calc.py."]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-tokens", "0"], "Invalid value for '--max-tokens'"),
        (["--max-tokens", "many"], "Invalid value for '--max-tokens'"),
        (["--temperature", "nan"], "is not a finite number"),
        (["--repeat-penalty", "0"], "Invalid value for '--repeat-penalty'"),
        (["-c", "--session", "kv"], "use either --session or -c/--continue, not both"),
        (["--repo", " "], "--repo and --book take a path, not an empty string"),
        (["--repo", ".", "--book", "b.txt"], "use either --repo or --book, not both"),
    ],
)
def test_bad_options_are_usage_errors_before_the_model_loads(args, needle):
    backend = ScriptedBackend([])
    result = ask(backend, "q", *args)
    assert result.exit_code == 2 and needle in result.stderr
    assert backend.loaded == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--session", "s-0123456789ab"], "s-0123456789ab"),
        (["-c"], "there is no session to continue; ask without -c to start one"),
    ],
)
def test_a_session_that_is_not_there_is_one_line_before_the_model_loads(repo, args, needle):
    backend = ScriptedBackend([])
    result = ask(backend, "q", "--repo", str(repo), *args)
    lines = result.stderr.splitlines()
    assert result.exit_code == 1 and len(lines) == 1
    assert lines[0].startswith("agentctx: error:") and needle in lines[0]
    assert backend.loaded == []


def test_a_session_keeps_its_repository(repo, home, tmp_path):
    backend = ScriptedBackend([("It adds.", "stop")])
    ask(backend, "What does add do?", "--repo", str(repo), "--session", "calc")
    result = ask(backend, "And?", "--session", "calc", "--repo", str(tmp_path))
    assert result.exit_code == 1 and "--repo/--book cannot change it" in result.stderr
    assert len(backend.loaded) == 1


def test_no_save_stores_nothing_and_keeps_no_kv(repo, home):
    backend = ScriptedBackend([("It adds.", "stop")])
    result = ask(backend, "What does add do?", "--repo", str(repo), "--no-save")
    assert result.exit_code == 0 and result.stdout == "It adds.\n"
    assert not (home / "sessions.db").exists()
    assert backend.saved == [] and backend.opened == [None]


def test_no_save_on_a_follow_up_leaves_the_session_as_it_was(repo, home):
    backend = ScriptedBackend([("It adds.", "stop"), ("In calc.py.", "stop")])
    ask(backend, "What does add do?", "--repo", str(repo), "--session", "calc")
    result = ask(backend, "Where is it?", "--session", "calc", "--no-save")
    assert result.exit_code == 0 and result.stdout == "In calc.py.\n"
    (session,), messages = stored(home)
    assert [m.role for m in messages[session.id]] == ["system", "user", "assistant"]
    assert backend.prompts[1][-1] == {"role": "user", "content": "Where is it?"}
    assert backend.opened == [None, None] and backend.saved == [session.id]


def test_json_prints_one_event_a_line_ending_with_usage(repo, home):
    backend = ScriptedBackend([("add returns a + b.", "stop")])
    result = ask(backend, "What does add do?", "--repo", str(repo), "--json")
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "info" and kinds[-1] == "usage" and "token" in kinds
    assert "loading model" not in result.stdout + result.stderr
    packing = events[0]
    assert packing["message"].startswith("packed 2 files")
    assert {f["path"] for f in packing["manifest"]["files"]} == {"README.md", "calc.py"}
    text = "".join(e["text"] for e in events if e["type"] == "token")
    assert text == "add returns a + b."
    (session,), _ = stored(home)
    usage = events[-1]
    assert usage["session"] == session.id and usage["finish_reason"] == "stop"
    assert usage["completion_tokens"] == 5  # (a word a token)


def test_a_cut_answer_is_marked_on_stderr(repo):
    backend = ScriptedBackend([("add returns", "length")])
    result = ask(backend, "What does add do?", "--repo", str(repo), "--max-tokens", "2")
    assert result.exit_code == 0 and result.stdout == "add returns\n"
    assert "[the answer was cut at 2 tokens, the --max-tokens limit" in result.stderr


def test_a_whole_answer_has_no_cut_marker(repo):
    result = ask(ScriptedBackend([("It adds.", "stop")]), "q", "--repo", str(repo))
    assert result.exit_code == 0 and "cut at" not in result.stderr


def test_an_error_before_any_answer_leaves_the_store_as_it_was(repo, home):
    backend = ScriptedBackend([("It adds.", "stop"), (ToolError("the tool broke"), "")])
    ask(backend, "What does add do?", "--repo", str(repo), "--session", "calc")
    before = stored(home)
    result = ask(backend, "And?", "--session", "calc")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == "agentctx: error: the tool broke"
    assert [m.content for m in stored(home)[1][before[0][0].id]] == [
        m.content for m in before[1][before[0][0].id]
    ]


def test_an_interrupt_keeps_the_partial_answer_and_says_where(repo, home):
    cut = KeyboardInterrupt()
    cut.partial = "add returns"
    backend = ScriptedBackend([(cut, "")])
    result = ask(backend, "What does add do?", "--repo", str(repo), standalone=False)
    cause = result.exception.__cause__  # (click's Abort, from the KeyboardInterrupt)
    (session,), messages = stored(home)
    assert interrupts.message(cause) == f"interrupted: the partial answer is stored in " \
                                        f"session {session.id}"  # fmt: skip
    answer = messages[session.id][-1]
    assert (answer.content, answer.status) == ("add returns", "interrupted")
    assert backend.saved == []  # no snapshot of a turn cut short


def test_tui_refuses_a_key_without_a_backend_and_an_unknown_backend_name(repo):
    runner = CliRunner()
    result = runner.invoke(cli, ["tui", "--repo", str(repo), "--api-key-env", "KEY"])
    assert result.exit_code == 2 and "--api-key-env is for a --backend" in result.output
    result = runner.invoke(cli, ["tui", "--repo", str(repo), "--backend", "cluster"])
    assert result.exit_code == 1 and "no backend named 'cluster'" in result.output


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["-c"], 1, "there is no session to continue"),
        (["--session", "nope"], 1, "no session with the id or name 'nope'"),
        (["-c", "--session", "x"], 2, "either --session or -c"),
        (["--book", "/no/such/book.txt"], 1, "book"),
        (["--book", " "], 2, "take a path"),
    ],
)  # fmt: skip
def test_tui_checks_what_it_resumes_or_reads_before_it_opens(repo, args, code, needle):
    result = CliRunner().invoke(cli, ["tui", "--repo", str(repo), *args])
    assert result.exit_code == code and needle in result.output, result.output
