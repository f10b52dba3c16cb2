"""scripts/tui_smoke.sh is a manual check in a real terminal (tmux, the real model): here only
its syntax is checked, so an edit that breaks it is caught without a terminal."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tui_smoke.sh"


def test_the_script_parses():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
