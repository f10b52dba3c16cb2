"""Prefill progress on stderr when it is a pipe (a log, CI) and when it is a terminal."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import textwrap

from agentctx.output import TextOutput
from agentctx.progress import Progress, duration

LINE = re.compile(r"prefill \[[#.]+\] +\d+% ([\d,]+)/([\d,]+) tokens")
ETA = r"ETA (\d+h\d\dm|\d+m\d\ds|\d+s)$"


class Clock:
    """Seconds that a test moves on (the chunks' durations), so line counts are exact."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def through_pipe(events, seconds_per_chunk: float, **kw) -> list[str]:
    """The lines a Progress writes into a real pipe for these (done, total) events, one chunk
    of `seconds_per_chunk` apart."""
    read_fd, write_fd = os.pipe()
    clock = Clock()
    with os.fdopen(write_fd, "w") as w:
        progress = Progress(w, clock=clock, **kw)
        assert not progress.tty
        for done, total in events:
            clock.now += seconds_per_chunk
            progress.prefill(done, total)
    with os.fdopen(read_fd) as r:
        return r.read().splitlines()


def chunks(total: int, chunk: int = 512) -> list[tuple[int, int]]:
    return [(min(n, total), total) for n in range(chunk, total + chunk, chunk)]


def done_of(line: str) -> int:
    return int(LINE.match(line).group(1).replace(",", ""))


def test_a_slow_prefill_writes_a_line_every_few_seconds():
    # 32K in 512-token chunks of 3 s each (a 2-core machine under load): about 27 minutes
    lines = through_pipe(chunks(32432), 3.0)
    assert all(LINE.match(line) for line in lines)
    assert lines[0].endswith("512/32,432 tokens")  # the first chunk: no rate yet
    assert lines[-1].startswith("prefill [########################] 100% 32,432/32,432")
    # a line at most every 2 chunks (6 s), never one per chunk
    dones = [done_of(line) for line in lines]
    assert max(b - a for a, b in zip(dones, dones[1:], strict=False)) <= 2 * 512
    assert len(lines) < len(chunks(32432)) * 0.6
    for line in lines[1:-1]:
        assert re.search(", 171 tok/s, " + ETA, line), line  # 512 tokens / 3 s


def test_the_eta_follows_the_rate():
    lines = through_pipe(chunks(10240, 1024), 10.0)  # 102.4 tok/s, 10% a chunk
    assert (
        lines[3]
        == "prefill [#########...............]  40% 4,096/10,240 tokens, 102 tok/s, ETA 1m00s"
    )
    assert lines[-1].endswith("100% 10,240/10,240 tokens, 102 tok/s, 1m30s")


def test_a_fast_prefill_writes_about_ten_lines_not_one_per_chunk():
    events = chunks(32432, 128)  # 254 chunks of 5 ms
    lines = through_pipe(events, 0.005)
    assert 10 <= len(lines) <= 12
    dones = [done_of(line) for line in lines]
    assert max(b - a for a, b in zip(dones, dones[1:], strict=False)) <= 32432 // 10 + 128


def test_each_prefill_of_an_agent_loop_starts_over():
    first, second = chunks(2048), chunks(3072)
    lines = through_pipe(first + [(3072 - 1024, 3072)] + second[-2:], 1.0)
    starts = [line for line in lines if "tok/s" not in line]
    assert [done_of(line) for line in starts] == [512, 2048]  # each prefill's first event
    assert lines[-1].endswith("3,072/3,072 tokens, 512 tok/s, 2s")


def test_a_prompt_in_one_chunk_writes_one_line():
    assert through_pipe([(300, 300)], 0.2) == [
        "prefill [########################] 100% 300/300 tokens"
    ]


def test_text_output_in_a_subprocess_writes_progress_lines_to_a_pipe():
    # real time and a real pipe: a prefill that never finishes (the case where 30 minutes
    # showed only "512/32432") still says how far it is, and how long it has left
    script = textwrap.dedent("""
        import time
        from agentctx.output import TextOutput
        out = TextOutput()
        out.progress.interval = 0.4
        for n in range(1, 41):
            time.sleep(0.05)
            out.prefill(1000 * n, 1_000_000)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert 3 <= len(lines) < 40, lines
    assert all(LINE.match(line) for line in lines)
    assert all(re.search(" tok/s, " + ETA, line) for line in lines[1:]), lines


def test_a_terminal_redraws_one_line():
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as tty:
        out = TextOutput(err=tty)
        assert out.progress.tty
        for done, total in chunks(4096):
            out.prefill(done, total)
    text = b""
    while True:  # (until the closed follower's end: EIO on Linux)
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        text += data
    os.close(leader)
    text = text.decode()
    assert text.startswith("\rprefill [") and text.count("\n") == 1
    assert "4,096/4,096 tokens" in text


def test_durations():
    assert [duration(s) for s in (0.4, 45, 186, 3720)] == ["0s", "45s", "3m06s", "1h02m"]
