"""`SessionStore.list(search=...)` over a real SQLite file: full-text search (FTS5) of the
questions and answers, kept current by triggers through every write, and a LIKE match of
titles and names; the packed context of a first turn is not searched."""

from __future__ import annotations

import pytest

from sessions.session_file import export_session, import_session


def names(store, text: str) -> list[str]:
    return [s.name for s in store.list(search=text)]


@pytest.fixture
def two(store):
    a = store.create("/src/net", "repo", "m", name="net", title="Where is retry handled?")
    store.add_message(a.id, "system", "You answer questions; mention jitter.")
    store.add_message(a.id, "user", "--- net.py ---\ndef backoff(jitter): ...\n\n"
                      "Question: Where is retry handled?")  # fmt: skip
    store.add_message(a.id, "assistant", "In client.py, with exponential backoff.")
    b = store.create("/src/ui", "repo", "m", name="ui_2")
    store.add_message(b.id, "user", "How are colours chosen?")
    return a, b


def test_questions_answers_titles_and_names_are_found(store, two):
    assert names(store, "exponential backoff") == ["net"]  # all the words, in an answer
    assert names(store, "retry handled") == ["net"]  # the question
    assert names(store, "colours") == ["ui_2"]
    assert names(store, "ui_") == ["ui_2"] and names(store, "_") == ["ui_2"]  # LIKE, escaped
    assert names(store, "jitter") == []  # only in the packed context and the system prompt
    assert names(store, "nothing like this") == []
    assert [s.name for s in store.list(search="  ")] == ["ui_2", "net"]  # blank: no filter


@pytest.mark.parametrize("text", ['"', "a AND", "NEAR(", "*", "col:umn", "-x", "'; drop"])
def test_query_syntax_is_plain_text(store, two, text):
    assert names(store, text) == []


def test_the_index_follows_updates_deletes_and_imports(store, two, tmp_path):
    a, b = two
    answer = store.add_message(b.id, "assistant", "From the theme")
    store.update_message(answer.id, content="From the palette file")  # as an answer streams
    assert names(store, "palette") == ["ui_2"] and names(store, "theme") == []
    path = tmp_path / "ui.jsonl"
    with open(path, "w") as fp:
        export_session(store, b.id, fp)
    store.delete(b.id)  # its messages go by cascade
    assert names(store, "palette") == []
    with open(path) as fp:
        import_session(store, fp)
    assert names(store, "palette") == ["ui_2"]
    assert store.db.execute("insert into messages_fts (messages_fts) values ('integrity-check')")
