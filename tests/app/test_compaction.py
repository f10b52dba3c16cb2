"""A context that never dead-ends (agentctx.compaction): the policy on its own (tool results
first, then the oldest turns, the root kept whole), then `agentctx ask -c` through click's
CliRunner over the real turn code (agentctx.ask.run_turn) with a scripted model that renders
every prompt through SmolLM2's own tokenizer and chat template, and a real SQLite store:
a session that used to stop with "longer than the model's window" goes on, says what its
prompt left out, and the store keeps every message. The KV reuse after a compaction is
measured with the real SmolLM2 (slow)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer

from agentctx.ask import history_messages
from agentctx.backend import EmbeddedBackend
from agentctx.cli import cli
from agentctx.compaction import (
    KEY,
    LEFT_OUT_RESULT,
    LEFT_OUT_TURNS,
    Compaction,
    fit,
    turn_starts,
)
from agentctx.output import SilentOutput
from engine.loading.loader import resolve_source
from sessions.store import SessionStore
from tests.app.scripted import ScriptedEngine

PACKED = "Repository files:\n\n" + "calc.py: def add(a, b): return a + b\n" * 5


def tool_step(name: str, result: str) -> list[dict]:
    call = {"type": "function", "function": {"name": name, "arguments": {"path": "calc.py"}}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": name, "content": result},
    ]


def conversation() -> list[dict]:
    """A root, three earlier turns (the first and third with a tool step) and a question."""
    return [
        {"role": "system", "content": "You answer questions."},
        {"role": "user", "content": f"{PACKED}\n\nQuestion: q1"},
        *tool_step("read_file", "r1 " * 40),
        {"role": "assistant", "content": "a1 " * 30},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2 " * 30},
        {"role": "user", "content": "q3"},
        *tool_step("grep", "r3 " * 40),
        {"role": "user", "content": "Answer now. The question: q3"},  # a step's note
        {"role": "assistant", "content": "a3 " * 30},
        {"role": "user", "content": "q4"},
    ]


def words(messages: list[dict]) -> int:
    return sum(len(m["content"].split()) + 4 for m in messages)


def by_words(messages: list[dict]):
    """A state's prompt size in words (fit's `size`)."""
    return lambda state: words(state.apply(messages))


def test_turns_start_after_the_root_and_at_each_question():
    messages = conversation()
    # turn 1 right after the root; a step's note (after a tool result) is not a question
    assert turn_starts(messages) == [2, 5, 7, 12]
    assert messages[12]["content"] == "q4"


def test_tool_results_go_first_oldest_first_then_the_oldest_turns():
    messages = conversation()
    steps = Compaction().candidates(messages)
    assert steps == [Compaction(0, 1), Compaction(0, 2), Compaction(1, 2), Compaction(2, 2),
                     Compaction(3, 2)]  # fmt: skip
    sent = Compaction(0, 1).apply(messages)
    assert [m["content"] for m in sent if m["role"] == "tool"] == [LEFT_OUT_RESULT, "r3 " * 40]
    assert len(sent) == len(messages)  # a result left out keeps its place (and its call)


def test_turns_left_out_become_one_note_and_the_root_is_sent_whole():
    messages = conversation()
    sent = Compaction(2, 2).apply(messages)
    assert sent[:2] == messages[:2]  # the packed context, whole
    assert sent[2] == {"role": "assistant", "content": LEFT_OUT_TURNS}  # the same for any number
    assert [m["content"] for m in sent[3:]] == [
        "q3", "", LEFT_OUT_RESULT, "Answer now. The question: q3", "a3 " * 30, "q4",
    ]  # fmt: skip
    roles = [m["role"] for m in sent if m["role"] in ("user", "assistant")]
    assert all(a != b for a, b in zip(roles[1:], roles[2:], strict=False)), roles
    # the current question is never left out, however much is asked for
    assert Compaction(9, 9).apply(messages)[-1]["content"] == "q4"
    assert Compaction(9, 9).apply(messages)[3]["content"] == "q4"


@pytest.mark.parametrize("share", [0.9, 0.5, 0.1])
def test_fit_leaves_out_the_least_that_frees_half_the_room(share):
    messages = conversation()
    full = words(messages)
    assert fit(messages, by_words(messages), full, Compaction()) == (Compaction(), full)  # it fits
    floor = words(Compaction(3, 2).apply(messages))  # everything earlier left out
    limit = floor + int((full - floor) * share)  # below the full prompt, above the least
    target = floor + (limit - floor) // 2  # half the room above the least prompt
    state, tokens = fit(messages, by_words(messages), limit, Compaction())
    assert tokens == words(state.apply(messages)) <= target
    steps = Compaction().candidates(messages)
    i = steps.index(state)
    assert i == 0 or words(steps[i - 1].apply(messages)) > target  # no less would do
    # a state only grows: a stored one is kept and more is left out on top of it
    assert fit(messages, by_words(messages), 10**6, Compaction(1, 0))[0] == Compaction(1, 0)
    # nothing fits: everything earlier left out, and the caller hears the tokens
    assert fit(messages, by_words(messages), floor - 1, Compaction()) == (Compaction(3, 2), floor)


@pytest.mark.parametrize(
    "data", [None, "x", {"turns": -1}, {"turns": True}, {"turns": 1, "results": "2"}, []]
)
def test_a_malformed_stored_state_is_none(data):
    assert Compaction.of(data) == Compaction()
    assert Compaction.stored([{"role": "assistant", "content": "a", KEY: data}]) == Compaction()


def test_the_state_round_trips_and_is_not_sent():
    state = Compaction(2, 3)
    history = [*conversation()[:-1]]
    history[6] = {**history[6], KEY: state.data()}
    assert Compaction.stored(history) == state
    assert all(KEY not in m for m in Compaction().apply(history))


# -- agentctx ask -c over the real turn code --------------------------------------------------

WINDOW = 1024
ANSWER = "The add function returns the sum of its two arguments, a and b. " * 12  # ~170 tokens


@pytest.fixture(scope="module")
def tokenizer_path(agentctx_home):
    return resolve_source(None).path  # SmolLM2 (the tests' default model): no tools


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTCTX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def scripted(tokenizer_path, replies: list[str]) -> ScriptedEngine:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    return ScriptedEngine(tokenizer, tokenizer.chat_template, replies, max_model_len=WINDOW)


def ask(engine, *args: str):
    load = lambda model, **options: EmbeddedBackend(engine)  # noqa: E731
    return CliRunner().invoke(cli, ["ask", *args], obj={"load_backend": load})


def stored_messages(home) -> list:
    with SessionStore(home / "sessions.db") as store:
        (session,) = store.list()
        return [(m.role, m.content) for m in store.messages(session.id)]


def test_a_session_past_the_window_goes_on_and_says_what_it_left_out(tokenizer_path, repo, home):
    engine = scripted(tokenizer_path, [ANSWER] * 8)
    first = ask(engine, "What does add do?", "--repo", str(repo), "--max-tokens", "100")
    assert first.exit_code == 0, first.output
    outputs = []
    for i in range(2, 8):
        result = ask(engine, f"And question {i}?", "-c", "--max-tokens", "100")
        assert result.exit_code == 0, result.stderr
        outputs.append(result)
    said = [r.stderr for r in outputs if "context: left out" in r.stderr]
    assert said, "no turn said it left something out"
    line = next(x for x in said[0].splitlines() if x.startswith("context: left out"))
    assert "the oldest" in line and "1,024-token window" in line and "store keeps them" in line
    # the stored conversation is longer than the window: without compaction it had stopped
    with SessionStore(home / "sessions.db") as store:
        (session,) = store.list()
        history = history_messages(store, session.id)
    assert len(engine.chat_tokens(history)) > WINDOW
    # every prompt fitted with room for the answer; the packed context was in each, whole
    root = engine.prompt_text(0).split("Question: What does add do?")[0]
    for ids in engine.prompts:
        assert len(ids) + 100 <= WINDOW
        assert engine.tokenizer.decode(ids).startswith(root)
    # the store keeps every message: 7 questions and 7 answers after the root
    messages = stored_messages(home)
    assert len(messages) == 2 + 1 + 6 * 2
    assert [c for r, c in messages if r == "assistant"] == [ANSWER] * 7
    assert [c for r, c in messages[3::2]] == [f"And question {i}?" for i in range(2, 8)]
    # and so does its export
    for fmt in ("jsonl", "markdown"):
        export = CliRunner().invoke(cli, ["sessions", "export", session.id, "--format", fmt])
        assert export.exit_code == 0, export.output
        assert export.stdout.count("sum of its two arguments") == 7 * ANSWER.count("sum of")
        assert all(f"And question {i}?" in export.stdout for i in range(2, 8))


def test_a_later_turn_keeps_the_prefix_until_the_window_fills_again(tokenizer_path, repo, home):
    engine = scripted(tokenizer_path, [ANSWER] * 8)
    ask(engine, "What does add do?", "--repo", str(repo), "--max-tokens", "100")
    compacted_at = []
    for i in range(2, 8):
        result = ask(engine, f"And question {i}?", "-c", "--max-tokens", "100")
        if "context: left out" in result.stderr:
            compacted_at.append(i)
    assert compacted_at and len(compacted_at) < 6  # not every turn once the window is full
    i = next(i for i in range(compacted_at[0] + 1, 8) if i not in compacted_at)
    before, after = engine.prompts[i - 2], engine.prompts[i - 1]
    assert after[: len(before)] == before  # the turn after a compaction appends to it


def test_json_has_a_compaction_event_and_the_usage_its_state(tokenizer_path, repo, home):
    engine = scripted(tokenizer_path, [ANSWER] * 8)
    ask(engine, "What does add do?", "--repo", str(repo), "--max-tokens", "100")
    events = []
    for i in range(2, 8):
        result = ask(engine, f"And question {i}?", "-c", "--max-tokens", "100", "--json")
        assert result.exit_code == 0, result.stderr
        events += [json.loads(x) for x in result.stdout.splitlines()]
    compactions = [e for e in events if e["type"] == "compaction"]
    assert compactions, [e["type"] for e in events]
    event = compactions[0]
    assert event["left_out"]["turns"] >= 1 and event["before"] == {"turns": 0, "results": 0}
    assert event["prompt_tokens"] < event["prompt_tokens_before"]
    assert event["message"].startswith("context: left out")
    last = [e for e in events if e["type"] == "usage"][-1]
    assert last[KEY]["turns"] >= event["left_out"]["turns"]
    # the store keeps the state with the answer; the history carries it to the next turn
    with SessionStore(home / "sessions.db") as store:
        (session,) = store.list()
        assert store.messages(session.id)[-1].timings[KEY] == last[KEY]


# -- the real model: the packed context's KV is reused after a compaction ---------------------


@pytest.fixture(scope="module")
def small_window_engine(agentctx_home):
    """SmolLM2 (the tests' default model) with a 512-token window, so a few short turns fill
    it."""
    from agentctx.app_paths import cache_dir
    from engine import Engine, EngineConfig

    config = EngineConfig(max_model_len=512, cache_dir=cache_dir())
    return Engine.load(None, device="cpu", config=config)


@pytest.mark.slow
def test_the_packed_context_kv_is_reused_after_a_compaction(small_window_engine, repo, tmp_path):
    """Turns over the real Conversation in one live session, as the TUI runs them: the turn
    that leaves earlier turns out still reuses the KV of the packed context before them."""
    from agentctx.ask import first_messages
    from agentctx.conversation import Conversation, Turn
    from agentctx.output import JsonOutput
    from agentctx.packing import pack_repository
    from engine import SamplingParams

    engine = small_window_engine
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    packed = pack_repository(str(repo), "add", engine.count_tokens, 200)
    convo, session, usages = Conversation(EmbeddedBackend(engine)), None, []
    with SessionStore(tmp_path / "sessions.db") as store:
        for i in range(6):
            out = JsonOutput(out=open(tmp_path / f"turn{i}.jsonl", "w"))  # noqa: SIM115
            turn = Turn(f"Question {i}: what does add do?", str(repo), session=session,
                        params=params)  # fmt: skip
            if session is None:
                turn.messages, turn.packed = first_messages(packed, turn.question), packed
            else:
                convo.pack(turn, history_messages(store, session.id), out)
            convo.open(session, out)
            convo.run(turn, out)
            session = convo.save(store, turn)
            out.out.close()
            events = [json.loads(x) for x in (tmp_path / f"turn{i}.jsonl").read_text().split("\n")
                      if x]  # fmt: skip
            usages.append((turn.usage, [e for e in events if e["type"] == "compaction"]))
        convo.close(JsonOutput(out=open(tmp_path / "close.jsonl", "w")))  # noqa: SIM115
        assert len(store.messages(session.id)) == 2 + 1 + 5 * 2
    compacted = [(usage, events[0]) for usage, events in usages if events]
    assert compacted, [u["prompt_tokens"] for u, _ in usages]
    usage, event = compacted[0]
    root = len(engine.chat_tokens(first_messages(packed, "Question 0: what does add do?")[:1]))
    assert usage["cached_tokens"] > 0 and usage["cached_tokens"] >= root - 16  # whole pages
    assert usage["prompt_tokens"] == event["prompt_tokens"] < event["prompt_tokens_before"]
    assert all(u["prompt_tokens"] + 64 <= 512 for u, _ in usages)


class Recorder(SilentOutput):
    """An output that keeps what a turn says, and the compaction events."""

    def __init__(self) -> None:
        self.lines, self.events = [], []

    def info(self, line):
        self.lines.append(line)

    def compacted(self, line, data):
        self.lines.append(line)
        self.events.append(data)


def test_a_tool_result_that_fills_the_window_leaves_the_earlier_turns_out(tokenizer_path, repo):
    """Mid-turn: the step after a large tool result would overflow; the earlier turns go,
    the result and the packed context stay."""
    from agentctx.ask import prompt_tokens, run_turn
    from engine import SamplingParams
    from tests.app.tool_templates import HERMES

    (repo / "big.py").write_text("".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(40)))
    read = {"name": "read_file", "arguments": {"path": "big.py"}}
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    engine = ScriptedEngine(tokenizer, HERMES, [f"<tool_call>{json.dumps(read)}</tool_call>",
                                                "f3 adds 3."])  # fmt: skip
    long = ANSWER * 3
    messages = [
        {"role": "system", "content": "You answer questions."},
        {"role": "user", "content": f"{PACKED}\n\nQuestion: What does add do?"},
        {"role": "assistant", "content": long},
        {"role": "user", "content": "And sub?"},
        {"role": "assistant", "content": long},
        {"role": "user", "content": "What does f3 do?"},
    ]
    first = prompt_tokens(engine, messages, str(repo), "repo", 6)
    engine.max_model_len = first + 50 + 200  # room for the answer and 200 tokens more
    out = Recorder()
    result = run_turn(engine, messages, SamplingParams(max_tokens=50), out, str(repo), "repo", 6)
    assert result.answer == "f3 adds 3."
    (event,) = out.events
    assert event["left_out"]["turns"] >= 1 and event["prompt_tokens"] + 50 <= engine.max_model_len
    second = engine.prompt_text(1)
    assert "return x + 39" in second and "Question: What does add do?" in second
    assert ANSWER not in second and "What does f3 do?" in second
    assert len(engine.prompts[1]) + 50 <= engine.max_model_len
