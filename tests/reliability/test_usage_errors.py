"""Usage and path errors are one `agentctx: error:` line and exit 2, in every command (not
click's Usage/Try/Error lines); --help still prints the help. Real `agentctx` processes."""

from __future__ import annotations

import subprocess

import pytest

from tests.reliability.cli_support import AGENTCTX

LONG_PATH = "/tmp/" + "a" * 5000


def agentctx(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*AGENTCTX, *args], capture_output=True, text=True, timeout=120)


CASES = {
    "import a directory": (["sessions", "import", "/"], "is a directory"),
    "import a missing path": (["sessions", "import", "/no/such/file.jsonl"], "does not exist"),
    "import an empty path": (["sessions", "import", ""], "does not exist"),
    "import -": (["sessions", "import", "-"], "does not exist"),
    "import a 5,000-character path": (["sessions", "import", LONG_PATH], "does not exist"),
    "export into a directory": (["sessions", "export", "s-000000", "-o", "/"], "directory"),
    "show without a session": (["sessions", "show"], "Missing argument 'REF'"),
    "list with an unknown option": (["sessions", "list", "--bogus"], "No such option"),
    "list with a bad limit": (["sessions", "list", "-n", "x"], "is not a valid integer"),
    "ask without a question": (["ask"], "Missing argument 'QUESTION'"),
    "ask for 0 tokens": (["ask", "q", "--max-tokens", "0"], "--max-tokens"),
    "ask with --session and -c": (["ask", "q", "-c", "--session", "x"], "either --session"),
    "models with an unknown option": (["models", "--bogus"], "No such option"),
    "install without a name": (["models", "install"], "Missing argument 'NAME'"),
    "a mistyped command": (["sesions"], "unknown command 'sesions' (did you mean 'sessions'?)"),
    "a lone word": (["summarize"], "unknown command 'summarize' (to ask it, use: agentctx ask"),
    "no command off a terminal": ([], "the TUI needs a terminal; usage: agentctx ask"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_usage_error_is_one_line(home, case):
    args, needle = CASES[case]
    proc = agentctx(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr[:2000]
    assert lines[0].startswith("agentctx: error: ") and needle in lines[0], lines[0][:500]
    assert len(lines[0]) < 600  # a 5,000-character path is clipped
    assert "Traceback" not in proc.stderr and "Usage:" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    "args", [["--help"], ["-h"], ["sessions", "import", "--help"], ["ask", "--help"]]
)
def test_help_is_still_help(home, args):
    proc = agentctx(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: agentctx") and "Options:" in proc.stdout
    assert proc.stderr == ""


def test_a_group_without_its_command_shows_its_help(home):
    proc = agentctx("sessions")
    assert proc.returncode == 2
    assert "Usage: agentctx sessions" in proc.stderr + proc.stdout
    assert "agentctx: error" not in proc.stderr
