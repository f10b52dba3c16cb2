"""sessions/markdown.py over a real SQLite store: a readable transcript with the packed
context, the system prompt and each tool call folded under the answer that made it."""

from __future__ import annotations

import io

from sessions.markdown import fence, write_markdown


def transcript(store) -> tuple[str, str]:
    s = store.create("/src/calc", "repo", "qwen2.5-coder-0.5b", name="calc",
                     title="What does add do?")  # fmt: skip
    store.add_message(s.id, "system", "You answer questions about a repository.")
    store.add_message(s.id, "user", "--- calc.py ---\ndef add(a, b):\n    return a + b\n"
                      "\nQuestion: What does add do?", tokens=1234)  # fmt: skip
    step = store.add_message(s.id, "assistant", '<tool_call>{"name": "read_file"}')
    store.add_tool_call(s.id, "read_file", {"path": "calc.py"}, result="```py\ndef add(a, b):\n```",
                        message_id=step.id)  # fmt: skip
    store.add_tool_call(s.id, "grep", {"pattern": "<add>"}, error="no match", message_id=step.id)
    store.add_message(s.id, "assistant", "It returns `a + b`.")
    store.add_message(s.id, "user", "And sub?")
    store.add_message(s.id, "assistant", "There is no sub", status="interrupted")
    out = io.StringIO()
    write_markdown(store, "calc", out)
    return s.id, out.getvalue()


def test_the_transcript_reads_in_order_with_the_bulk_folded(store):
    sid, md = transcript(store)
    assert md.startswith("# What does add do?\n\n- session: " + sid + " (calc)\n")
    assert "- reads: /src/calc (repo)\n- model: qwen2.5-coder-0.5b\n" in md
    order = [md.index(x) for x in ("system prompt", "## You\n\nWhat does add do?",
                                   "packed context, 1,234 tokens", "tool: read_file(path='calc.py')",
                                   "tool: grep(pattern='&lt;add&gt;') (error)", "It returns `a + b`.",
                                   "## You\n\nAnd sub?", "## agentctx (interrupted)\n\nThere is no sub")]  # fmt: skip
    assert order == sorted(order)
    assert md.count("<details>") == md.count("</details>") == 4  # system, context, two calls
    # the packed file is inside the fold, not in the question
    question = md.index("## You\n\nWhat does add do?")
    assert md.index("def add(a, b):") > md.index("<summary>packed context", question)


def test_a_result_with_backticks_gets_a_longer_fence(store):
    assert fence("a\n```py\nb\n```") == "````\na\n```py\nb\n```\n````"
    assert fence("plain") == "```\nplain\n```"
    _, md = transcript(store)
    assert "````\n```py\ndef add(a, b):\n```\n````" in md
