"""/add PATH and /drop PATH: what the next turn packs. The packing itself over a real git
repository, then the TUI driven with Pilot over the real SmolLM2 model and a real store:
refused paths (outside the root, secrets, missing files) are one line, /context names the
changes, the turn packs with them, a follow-up gets an added file in full."""

from __future__ import annotations

import os

import pytest

from agentctx.context_choice import CHOICE, REASON_DROPPED, ContextChoice
from agentctx.packing import pack_repository
from agentctx.tui.app import AgentApp
from agentctx.tui.widgets import AssistantMessage, LogLine
from engine import Engine, SamplingParams
from sessions.store import SessionStore
from tests.app.pilot_support import submit as submit_line
from tools.errors import ToolError

SIZE = (100, 30)
NOTES = " ".join(f"word{i}" for i in range(300))  # a long file no question ranks first


def words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def root(repo):
    (repo / "notes.md").write_text(f"# notes\n\n{NOTES}\n")
    adders = "".join(f"def add_{i}(a, b):\n    return a + b + {i}\n" for i in range(60))
    (repo / "adders.py").write_text(adders)  # ranks above notes.md for the question
    (repo / ".env").write_text("API_KEY=sk-live-123\n")
    return repo


def pack(root, choice=None):
    token = CHOICE.set(choice)
    try:
        return pack_repository(root, "What does add do?", words, 500, map_budget=100)
    finally:
        CHOICE.reset(token)


def test_packing_takes_an_added_file_in_full_and_leaves_a_dropped_one_out(root):
    plain = pack(root)
    assert "notes.md" not in {f.path for f in plain.files if f.packed == "full"}
    assert "calc.py" in {f.path for f in plain.files}
    choice = ContextChoice()
    assert choice.add(str(root), "notes.md") == "notes.md"
    assert choice.drop(str(root), str(root / "calc.py")) == "calc.py"  # absolute, inside
    packed = pack(root, choice)
    assert packed.files[0].path == "notes.md" and packed.files[0].packed == "full"
    assert "calc.py" not in {f.path for f in packed.files}
    assert "calc.py" not in {e.path for e in packed.excerpts}  # nor its definitions
    (dropped,) = [o for o in packed.omitted if o.path == "calc.py"]
    assert dropped.reason == REASON_DROPPED and dropped.tokens > 0
    assert "def add(a, b)" not in packed.text and "word299" in packed.text


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../outside.txt", "outside the repository"),
        ("/etc/hostname", "outside the repository"),
        (".env", "looks like a secret"),
        ("nosuch.py", "nosuch.py"),
    ],
)
def test_a_path_outside_the_root_or_a_secret_is_refused(root, path, message):
    (root.parent / "outside.txt").write_text("not the repository's\n")
    choice = ContextChoice()
    for verb in (choice.add, choice.drop):
        with pytest.raises(ToolError, match=message):
            verb(str(root), path)
    assert not choice.added and not choice.dropped


# -- the TUI -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(agentctx_home):
    return Engine.load(None, device="cpu")


async def submit(pilot, text: str) -> None:
    await submit_line(pilot, text, wait=True)


def last(app, cls) -> str:
    found = list(app.screen.query(cls))
    w = found[-1]
    return w.text if isinstance(w, AssistantMessage) else str(w.render())


@pytest.mark.anyio
async def test_add_and_drop_in_the_tui(engine, root, tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        app = AgentApp(repo=str(root), engine_factory=lambda m: engine, store=store,
                       params=SamplingParams(max_tokens=4))  # fmt: skip
        async with app.run_test(size=SIZE) as pilot:
            for line, said in [("/add ../../etc/passwd", "outside the repository"),
                               ("/add .env", "looks like a secret"),
                               ("/drop nosuch.py", "no such file"),
                               ("/add", "/add PATH")]:  # fmt: skip
                await submit(pilot, line)
                shown = last(app, LogLine)
                assert said in shown and "\n" not in shown.strip(), shown
            await submit(pilot, "/add notes.md")
            await submit(pilot, "/drop README.md")
            await submit(pilot, "/context")
            context = last(app, AssistantMessage)
            assert "+ notes.md  about" in context and "- README.md  left out" in context
            await submit(pilot, "What does add do?")
            sid = app.session.id
            manifest = store.manifests(sid)[-1]
            assert {"path": "notes.md", "packed": "full"}.items() <= next(
                f for f in manifest.files if f["path"] == "notes.md").items()  # fmt: skip
            assert "README.md" not in {f["path"] for f in manifest.files}
            assert any(o["path"] == "README.md" and o["reason"] == REASON_DROPPED
                       for o in manifest.omitted)  # fmt: skip
            await submit(pilot, "/context")  # the stored manifest; the choice is used up
            context = last(app, AssistantMessage)
            assert "notes.md" in context and "README.md" in context
            assert "(dropped with /drop)" in context and "for the next turn" not in context
            await submit(pilot, "/add calc.py")  # a follow-up: the file after its question
            await submit(pilot, "And subtract?")
            question = [m for m in store.messages(sid) if m.role == "user"][-1].content
            assert question.startswith("And subtract?") and "def add(a, b):" in question
            everything = " ".join(m.content for m in store.messages(sid))
            assert "sk-live-123" not in everything
    assert os.path.exists(root / ".env")  # nothing touched the files
