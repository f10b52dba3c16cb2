"""A pytest plugin that measures the reliability matrix: per family of tests/reliability, the
test cases run and failed, and the hostile inputs tried, counted where they enter the code
under test (every call passes through unchanged):

- tool calls: tools.registry.run_tool;
- session imports: sessions.session_file.import_session, and `agentctx sessions import`;
- snapshot loads: engine.kv.snapshot.load_snapshot (a session opened from a snapshot);
- model configs: engine.config.ModelConfig.from_hf (every checkpoint, GGUF or dummy config);
- CLI runs: `python -m agentctx` processes (those that import or continue count there too).

    .venv/bin/python -m pytest tests/reliability -p tests.reliability.attempts

prints the table at the end (docs/reliability.md holds a run of it).
"""

from __future__ import annotations

import functools
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

FAMILIES = {
    "test_hostile_regex.py": "hostile regexes, wall-clock bound",
    "test_hostile_arguments.py": "every tool, hostile arguments and roots",
    "test_outline_depth.py": "every tool, hostile arguments and roots",
    "test_subfolder_git.py": "subfolder-root git confinement",
    "test_foreign_git.py": "subfolder-root git confinement",
    "test_secrets.py": "secrets never reach the model",
    "test_turn_kept.py": "kill -9, SIGTERM, SIGHUP mid-answer",
    "test_store_races.py": "racing creators, export under writes",
    "test_readonly_store.py": "read-only store refused before generation",
    "test_snapshot_headers.py": "crafted snapshot headers, FIFO, stale temporaries",
    "test_session_file_counts.py": "truncated session files refused",
    "test_usage_errors.py": "single-line usage errors",
    "test_fuzz_session_files.py": "fuzz: mutated session files",
    "test_fuzz_snapshot_headers.py": "fuzz: mutated snapshot headers",
    "test_garbage_checkpoints.py": "garbage checkpoint directories",
    "test_cli_limits.py": "KV budget 0, nothing in the temp dir",
}
KINDS = ("tool calls", "session imports", "snapshot loads", "model configs", "CLI runs")

_current: list[str] = [""]
_counts: dict[str, Counter] = defaultdict(Counter)
_outcomes: dict[str, Counter] = defaultdict(Counter)
_depth: Counter = Counter()


def _counted(kind: str, fn):
    """fn, counting its outermost calls (import_session calls itself once for a path)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _depth[kind]:
            _counts[_current[0]][kind] += 1
        _depth[kind] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _depth[kind] -= 1

    return wrapper


def pytest_configure(config) -> None:
    import engine.config
    import engine.kv.snapshot
    import sessions.session_file
    import tools.registry

    tools.registry.run_tool = _counted("tool calls", tools.registry.run_tool)
    sessions.session_file.import_session = _counted(
        "session imports", sessions.session_file.import_session
    )
    engine.kv.snapshot.load_snapshot = _counted("snapshot loads", engine.kv.snapshot.load_snapshot)
    from_hf = engine.config.ModelConfig.from_hf.__func__
    engine.config.ModelConfig.from_hf = classmethod(_counted("model configs", from_hf))
    popen_init = subprocess.Popen.__init__

    @functools.wraps(popen_init)
    def init(self, args, *rest, **kwargs):
        argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)]
        if "agentctx" in argv[1:3] and "-m" in argv[1:2]:
            _counts[_current[0]]["CLI runs"] += 1
            if "import" in argv and "sessions" in argv:
                _counts[_current[0]]["session imports"] += 1
        popen_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = init


def pytest_runtest_setup(item) -> None:
    _current[0] = Path(str(item.fspath)).name


def pytest_runtest_logreport(report) -> None:
    name = Path(report.nodeid.split("::")[0]).name
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _outcomes[name]["failed" if report.failed else report.outcome] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    rows: dict[str, list] = {}
    order = list(FAMILIES)
    ran = set(_outcomes) | (set(_counts) - {""})
    for name in sorted(ran, key=lambda n: (order.index(n) if n in order else len(order), n)):
        family = FAMILIES.get(name, name)
        row = rows.setdefault(family, [set(), Counter(), Counter()])
        row[0].add(name)
        row[1].update(_outcomes[name])
        row[2].update(_counts[name])
    write = terminalreporter.write_line
    write("")
    write("| family | test files | cases | failed | skipped | inputs tried |")
    write("| --- | --- | --- | --- | --- | --- |")
    total = Counter()
    for family, (names, outcomes, counts) in rows.items():
        cases = outcomes["passed"] + outcomes["failed"] + outcomes["skipped"]
        total.update(outcomes)
        tried = ", ".join(_amount(counts[k], k) for k in KINDS if counts[k]) or "-"
        files = ", ".join(f"`{n}`" for n in sorted(names))
        write(f"| {family} | {files} | {cases} | {outcomes['failed']} | "
              f"{outcomes['skipped']} | {tried} |")  # fmt: skip
    write(f"| all | | {sum(total.values())} | {total['failed']} | {total['skipped']} | |")


def _amount(n: int, kind: str) -> str:
    return f"{n:,} {kind}" if n != 1 else f"1 {kind.replace('calls', 'call').rstrip('s')}"
