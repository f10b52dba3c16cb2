"""agentctx.turn_record: a turn stored while it happens, in a real SQLite store (no model)."""

from __future__ import annotations

import pytest

from agentctx.agent import ToolCallRecord, ToolStep
from agentctx.ask import TurnResult, history_messages
from agentctx.conversation import Turn
from agentctx.turn_record import TurnRecord, save_turn
from sessions.store import SessionStore

MESSAGES = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "Repository files:\n\n...\n\nQuestion: What is x?"},
]


@pytest.fixture
def store(tmp_path):
    s = SessionStore(tmp_path / "sessions.db")
    yield s
    s.close()


def start(store, session=None, name=None, question="What is x?"):
    turn = Turn(question, "/r", session=session, name=name, model="m", messages=MESSAGES)
    return TurnRecord.start(store, turn)


def test_the_question_is_stored_before_the_answer_and_the_answer_as_it_streams(store):
    record = start(store)
    msgs = store.messages(record.session.id)
    assert [(m.role, m.content, m.status) for m in msgs[1:]] == [
        ("user", MESSAGES[1]["content"], "complete"),
        ("assistant", "", "interrupted"),  # what a kill -9 now would leave
    ]
    record.stream(lambda: "It is")
    assert store.message_table.get(record.answer_id).content == "It is"  # the first text: at once
    record.stream(lambda: "It is one")  # within FLUSH_S of the last write: not yet
    assert store.message_table.get(record.answer_id).content == "It is"
    record._last -= 1.0  # (a second later)
    record.stream(lambda: "It is one.")
    assert store.message_table.get(record.answer_id).content == "It is one."
    session = record.finish(TurnResult("It is one.", "stop", {"completion_tokens": 4}), "complete")
    answer = store.messages(session.id)[-1]
    assert (answer.content, answer.status, answer.tokens) == ("It is one.", "complete", 4)


def test_a_tool_step_is_stored_before_the_next_step_streams(store):
    record = start(store)
    call = ToolCallRecord("grep", {"pattern": "x"}, result="a.py:1: x = 1")
    record.step(ToolStep("Let me look.", [call], after="Now answer: What is x?"))
    record.stream(lambda: "x is 1")
    msgs = store.messages(record.session.id)
    assert [(m.role, m.content, m.status) for m in msgs[2:]] == [
        ("assistant", "Let me look.", "complete"),
        ("user", "Now answer: What is x?", "complete"),
        ("assistant", "x is 1", "interrupted"),
    ]
    (stored,) = store.tool_calls(record.session.id)
    assert stored.message_id == msgs[2].id and stored.result == "a.py:1: x = 1"


def test_an_answers_generated_ids_are_stored_and_sent_again_with_it(store):
    """The ids go with the final answer only; history_messages hands them to the engine,
    which keeps them in the next prompt (engine.runtime.chat_ids)."""
    record = start(store)
    call = ToolCallRecord("grep", {"pattern": "x"}, result="a.py:1: x = 1")
    record.step(ToolStep("Let me look.", [call], after="Now answer: What is x?"))
    result = TurnResult("x is 1", "stop", {"completion_tokens": 4}, token_ids=[87, 318, 220, 16])
    session = record.finish(result, "complete")
    assert [m.token_ids for m in store.messages(session.id)] == [None] * 4 + [[87, 318, 220, 16]]
    history = history_messages(store, session.id)
    assert history[-1] == {
        "role": "assistant",
        "content": "x is 1",
        "token_ids": [87, 318, 220, 16],
    }
    assert all("token_ids" not in m for m in history[:-1])
    second = start(store, session, question="And y?")  # an answer without ids: its text only
    record = second.finish(TurnResult("y is 2", "stop", {}), "complete")
    assert history_messages(store, session.id)[-1] == {"role": "assistant", "content": "y is 2"}


def test_a_name_taken_meanwhile_is_followed_up_not_refused(store):
    first = start(store, name="racer", question="one?")
    second = start(store, name="racer", question="two?")  # (it too found no such session)
    assert second.session.id == first.session.id and len(store.list()) == 1
    msgs = store.messages(first.session.id)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[3].content == "two?"


def test_an_error_before_any_answer_leaves_the_store_as_it_was(store):
    result = TurnResult("x is 1", "stop", {})
    turn = Turn("What is x?", "/r", model="m", messages=MESSAGES, result=result)
    turn.status = "complete"
    kept = save_turn(store, turn)
    start(store).fail_unanswered()  # a new session: removed whole
    assert [s.id for s in store.list()] == [kept.id]
    follow = start(store, session=kept, question="And y?")
    follow.fail_unanswered()  # a follow-up: its question and answer removed
    assert [m.content for m in store.messages(kept.id)][-1] == "x is 1"
    answered = start(store, session=kept, question="And z?")
    answered.stream(lambda: "z is")
    answered.fail_unanswered()  # something was answered: kept, marked error
    assert [(m.content, m.status) for m in store.messages(kept.id)[-2:]] == [
        ("And z?", "complete"),
        ("z is", "error"),
    ]
