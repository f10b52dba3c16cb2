"""The packing manifest: as data (the --json info event, the session store) and as text
(`ask --show-packing`, `/context`, `sessions show`), naming every file with how it was packed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentctx.packing import pack_repository
from agentctx.packing_report import MAP_PATH, manifest_data, report_lines, stored_manifest
from sessions.store import SessionStore
from tests.app.test_cli import agentctx
from tests.app.test_sessions_cli import home, repo  # noqa: F401 (fixtures)
from tests.tools.support import write


def words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    root = tmp_path / "lib"
    write(root, "README.md", "# lib\n\nParses dates.\n")
    write(root, "lib/dates.py", "def parse_date(s):\n    return s\n" + "# padding line\n" * 80)
    write(root, "lib/zones.py", "class Zone:\n    def offset(self):\n        return 0\n")
    write(root, "lib/calendar.py", "class Calendar:\n" + "    days = 7\n" * 200)
    write(root, "data/table.csv", "a,b\n1,2\n")
    write(root, "logo.png", b"\x89PNG\r\n\x1a\n\0\0")
    return root


def test_the_report_names_every_file_once_with_how_it_was_packed(lib: Path) -> None:
    whole = pack_repository(lib, "q", words, 100_000)
    readme = next(f.tokens for f in whole.files if f.path == "README.md")
    budget = whole.map.tokens + readme + 200  # README whole, dates.py's head
    packed = pack_repository(
        lib, "How is a date parsed? parse_date", words, budget, map_budget=budget
    )

    lines = report_lines(*stored_manifest(packed), tokens=packed.tokens)

    assert lines[0] == f"context: {packed.tokens:,} tokens"
    assert lines[1].startswith("repository map: all 6 files, ")
    text = "\n".join(lines)
    sections = [line for line in lines if not line.startswith(" ")][2:]
    assert [s.split(" (")[0] for s in sections] == [
        "packed in full",
        "truncated",
        "outlined, in the map only",
        "by path and size, in the map only",
    ]
    assert "  lib/dates.py  " in text and "(lines 1-" in text and "of 82)" in text
    for path in ("README.md", "lib/dates.py", "lib/zones.py", "lib/calendar.py", "data/table.csv",
                 "logo.png"):  # fmt: skip
        assert sum(line.startswith(f"  {path}  ") for line in lines) == 1, path
    assert "  logo.png  not read (binary)" in text


def test_the_manifest_as_data(lib: Path) -> None:
    packed = pack_repository(lib, "q", words, 100_000)

    data = json.loads(json.dumps(manifest_data(packed)))

    assert data["map"]["path"] == MAP_PATH and data["map"]["listed"] == 6
    assert {f["path"] for f in data["files"]} == {
        "README.md", "lib/dates.py", "lib/zones.py", "lib/calendar.py", "data/table.csv"
    }  # fmt: skip
    assert data["omitted"] == [
        {"path": "logo.png", "tokens": None, "reason": "binary", "map": "path"}
    ]
    assert data["tokens"] == packed.tokens and data["budget"] == 100_000


def test_an_older_stored_manifest_still_reads() -> None:
    lines = report_lines(
        [{"path": "a.py", "tokens": 12}], [{"path": "big.bin", "tokens": None, "reason": "binary"}]
    )
    assert lines == [
        "packed in full (1 file, 12 tokens):",
        "  a.py  12 tokens",
        "left out (1 file):",
        "  big.bin  not read (binary)",
    ]


def test_sessions_show_displays_the_manifest(home, lib: Path) -> None:  # noqa: F811
    packed = pack_repository(lib, "q", words, 100_000)
    with SessionStore(home / "sessions.db") as store:
        s = store.create(str(lib), "repo", "default", name="dates")
        store.add_message(s.id, "user", "q")
        files, omitted = stored_manifest(packed)
        store.add_manifest(s.id, files, omitted, tokens=packed.tokens, commit_sha=packed.commit)

    shown = agentctx("sessions", "show", "dates")

    assert shown.returncode == 0, shown.stderr
    assert "--- packed context" in shown.stdout
    assert "repository map: all 6 files" in shown.stdout
    assert "  lib/zones.py  " in shown.stdout and "  logo.png  not read (binary)" in shown.stdout
    data = json.loads(agentctx("sessions", "show", "dates", "--json").stdout)
    [manifest] = data["manifests"]
    assert manifest["files"][0]["path"] == MAP_PATH and manifest["tokens"] == packed.tokens


@pytest.mark.e2e
@pytest.mark.slow
def test_ask_shows_the_packing_and_its_json_info_event_carries_the_manifest(home, repo):  # noqa: F811
    proc = agentctx("ask", "What does this do?", "--repo", str(repo), "--max-tokens", "2",
                    "--show-packing", "--no-save")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "repository map: all 2 files" in proc.stderr
    assert "packed in full (2 files" in proc.stderr and "  greet.py  " in proc.stderr

    proc = agentctx("ask", "What does this do?", "--repo", str(repo), "--max-tokens", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    [info] = [e for e in events if e["type"] == "info" and "manifest" in e]
    assert info["message"].startswith("packed 2 files")
    assert {f["path"] for f in info["manifest"]["files"]} == {"README.md", "greet.py"}
    assert info["manifest"]["map"]["listed"] == 2
    shown = agentctx("sessions", "show", json.loads(proc.stdout.splitlines()[-1])["session"])
    assert "repository map: all 2 files" in shown.stdout, shown.stderr


class WordEngine:
    """What packing asks of an engine, with words for tokens (a template that takes no tools)."""

    tokenizer = None

    def __init__(self, window: int) -> None:
        self.max_model_len = window

    def chat_tokens(self, messages, add_generation_prompt=True, tools=None) -> list[str]:
        return " ".join(m["content"] for m in messages).split()

    def count_tokens(self, text: str) -> int:
        return words(text)


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, line: str) -> None:
        self.lines.append(line)


def test_a_book_warns_in_the_report_and_refuses_when_nothing_fits(tmp_path: Path) -> None:
    from agentctx.ask import new_session_messages
    from engine import SamplingParams
    from tools.errors import ToolError

    novel = tmp_path / "novel.txt"
    novel.write_text("".join(f"The lamp burned low in room {i}.\n\n" for i in range(3000)))
    params = SamplingParams(max_tokens=10)
    out = Lines()

    messages, packed = new_session_messages(
        WordEngine(100_000), str(novel), "Why did the lamp burn?", params, 200, out, "book", True
    )

    assert packed.files and packed.tokens <= 200
    [summary, warning, report] = out.lines
    assert summary.startswith("packed 1 chapter") and warning.startswith("warning: almost")
    assert report.splitlines()[-1] == warning
    assert "truncated (1 file" in report and "left out (" in report
    assert "The lamp burned low" in messages[1]["content"]
    with pytest.raises(ToolError, match="nothing of the book fits in the 1-token budget"):
        new_session_messages(WordEngine(1090), str(novel), "Why?", params, None, Lines(), "book")
