"""Our CPU engine against llama.cpp on the same GGUF, in the same run, with the same threads:
decode tok/s at 512 and 16K tokens of context, prefill tok/s at 4K and 16K.

    python -m bench.cpu_vs_llamacpp --model PATH.gguf|NAME [--threads 2] [--weights dense int4 int4-all]
        [--new-tokens 32] [--reps 1] [--json OUT.json]

llama.cpp: the CPU build of bench.peers.llamacpp (`make llamacpp`), `llama-bench -t T -p 0 -n N
-d 512,16384` for decode (its depth's KV is prefilled once, then N tokens are timed) and
`-p 4096,16384 -n 0 --no-warmup` for prefill, -r REPS, everything else at its defaults.
Ours: Engine.load(model, device="cpu", weights=MODE) with torch at T threads, prompts of real
prose (bench.cpu_generate.text_tokens), the prefix cache reset before every request; decode
at context C is a C-token prompt and N new tokens (as llama-bench's depth C), prefill at P is
P / time to first token. A length that is both (16K) is one request. Each --weights mode is
loaded and measured in turn; a mode the engine refuses for this file is reported as refused.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from bench.peers import llamacpp
from bench.peers.llamacpp import LlamaCppError


def gguf_file(model: str) -> Path:
    """The one GGUF file llama.cpp reads: the path given, or a known model's file (its parts
    joined once into the peer's cache when the model is stored split)."""
    path = Path(model).expanduser()
    if path.is_file():
        return path
    from engine.loading import model_catalog

    known = model_catalog.lookup(model)
    if known is None:
        raise LlamaCppError(f"{model} is neither a GGUF file nor a known model name")
    files = model_catalog.verified_files(known)
    if len(files) == 1:
        return files[0]
    joined = llamacpp.cache_root() / "models" / f"{known.name}.gguf"
    if not joined.is_file() or joined.stat().st_size != known.size:
        joined.parent.mkdir(parents=True, exist_ok=True)
        tmp = joined.with_suffix(".part")
        with open(tmp, "wb") as out:
            for f in files:
                out.write(f.read_bytes())
        tmp.rename(joined)
    return joined


def cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("model name")), platform.machine())  # fmt: skip


def run_llamacpp(model: Path, args) -> dict:
    made = llamacpp.find_build(cuda=False)
    bench = made.binary("llama-bench")
    log = Path(args.log) if args.log else None
    t, r = ["-t", str(args.threads)], ["-r", str(args.reps)]
    if args.no_repack:  # llama.cpp's repacked (AMX) kernels segfault on some Xeons
        r += ["--repack", "0"]
    depths = ",".join(map(str, args.decode_contexts))
    prompts = ",".join(map(str, args.prefill_tokens))
    decode = llamacpp.run_bench(bench, ["-m", str(model), *t, "-p", "0", "-n",
                                        str(args.new_tokens), "-d", depths, *r], log)  # fmt: skip
    prefill = llamacpp.run_bench(bench, ["-m", str(model), *t, "-p", prompts, "-n", "0",
                                         "--no-warmup", *r], log) if prompts else []  # fmt: skip
    return {
        "version": made.version,
        "flags": made.record["flags"],
        "repack": not args.no_repack,
        "decode": {str(x["n_depth"]): x["avg_ts"] for x in decode},
        "prefill": {str(x["n_prompt"]): x["avg_ts"] for x in prefill},
        "raw": decode + prefill,
    }


def run_ours(model: str, mode: str, args) -> dict:
    import torch

    from bench.cpu_generate import Ours, text_tokens
    from engine import EngineConfig, EngineError, SamplingParams

    class OursOn(Ours):  # bench.cpu_generate's driver, on this model with one sequence's pool
        def __init__(self, model: str, weights: str):
            from engine import Engine

            self.engine = Engine.load(model, device="cpu", weights=weights,
                                      config=EngineConfig(max_num_seqs=1))  # fmt: skip

    torch.set_num_threads(args.threads)
    t = time.perf_counter()
    try:
        ours = OursOn(model, mode)
    except EngineError as e:
        return {"refused": str(e)}
    load_s = time.perf_counter() - t
    ids = text_tokens(ours.engine.tokenizer, max(args.decode_contexts + args.prefill_tokens))
    ours.decode(ids[:64], 4)  # warm-up
    decode: dict[str, list[float]] = {str(c): [] for c in args.decode_contexts}
    prefill: dict[str, list[float]] = {str(p): [] for p in args.prefill_tokens}
    for _ in range(args.reps):
        for n in sorted(set(args.decode_contexts + args.prefill_tokens)):
            ours.engine.block_manager.reset_prefix_cache()
            new = args.new_tokens if str(n) in decode else 1
            params = SamplingParams(max_tokens=new, ignore_eos=True)
            c = ours.engine.generate([ids[:n]], params)[0]
            if str(n) in decode:
                decode[str(n)].append(c.stats.decode_tok_s)
            if str(n) in prefill:
                prefill[str(n)].append(n / c.stats.ttft_s)
            print(f"  ours {mode} {n}: prefill {n / c.stats.ttft_s:.1f} tok/s, "
                  f"decode {c.stats.decode_tok_s:.1f} tok/s", file=sys.stderr, flush=True)  # fmt: skip
    return {
        "weights_mode": ours.engine.weights_mode,
        "load_s": load_s,
        "decode": {k: statistics.median(v) for k, v in decode.items()},
        "prefill": {k: statistics.median(v) for k, v in prefill.items()},
        "samples": {"decode": decode, "prefill": prefill},
    }


def render(res: dict) -> str:
    peer = res.get("llamacpp") or {}
    modes = list(res["ours"])
    head = f"{'':22s}{'llama.cpp':>12s}" + "".join(
        f"{'agentctx ' + m:>18s}{'ratio':>8s}" for m in modes
    )
    lines = [head]
    for kind, key, label in [
        ("decode", c, f"decode @ {c} context") for c in res["decode_contexts"]
    ] + [("prefill", p, f"prefill {p} tokens") for p in res["prefill_tokens"]]:
        ref = peer.get(kind, {}).get(str(key))
        line = f"{label:22s}" + (f"{ref:12.1f}" if ref else f"{'-':>12s}")
        for m in modes:
            ours = res["ours"][m]
            if "refused" in ours:
                line += f"{'refused':>18s}{'':>8s}"
                continue
            v = ours[kind].get(str(key))
            ratio = f"{v / ref:7.2f}x" if ref and v else f"{'-':>8s}"
            line += f"{v:18.1f}{ratio}"
        lines.append(line)
    for m in modes:
        if "refused" in res["ours"][m]:
            lines.append(f"agentctx {m}: refused: {res['ours'][m]['refused']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu_vs_llamacpp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", required=True, help="a .gguf file or a known model name")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", nargs="+", default=["dense", "int4"], help="our modes to run")
    ap.add_argument("--decode-contexts", type=int, nargs="+", default=[512, 16384])
    ap.add_argument("--prefill-tokens", type=int, nargs="*", default=[4096, 16384])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=1, help="repetitions per test, both sides")
    ap.add_argument("--skip", choices=["llamacpp", "ours"], help="measure one side only")
    ap.add_argument("--no-repack", action="store_true",
                    help="llama-bench --repack 0: without its repacked weights (on an AMX Xeon "
                         "their kernels segfault on any batch of more than one token)")  # fmt: skip
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--log", help="append llama-bench's own output here")
    args = ap.parse_args(argv)
    bad = [m for m in args.weights if m not in ("dense", "int4", "int4-all")]
    if bad:
        print(
            f"error: unknown weights mode {bad[0]!r}; use dense, int4 or int4-all", file=sys.stderr
        )
        return 1
    try:
        model = gguf_file(args.model)
        res = {"model": str(model), "threads": args.threads, "new_tokens": args.new_tokens,
               "reps": args.reps, "decode_contexts": args.decode_contexts,
               "prefill_tokens": args.prefill_tokens, "cpu": cpu_name(),
               "ours": {}}  # fmt: skip
        t = time.perf_counter()
        if args.skip != "llamacpp":
            res["llamacpp"] = run_llamacpp(model, args)
            res["llamacpp"]["wall_s"] = time.perf_counter() - t
            print(f"llama.cpp done in {res['llamacpp']['wall_s']:.0f} s", file=sys.stderr)
        if args.skip != "ours":
            for mode in args.weights:
                t = time.perf_counter()
                res["ours"][mode] = run_ours(str(model), mode, args)
                res["ours"][mode]["wall_s"] = time.perf_counter() - t
    except LlamaCppError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    cpu = (res.get("llamacpp", {}).get("raw") or [{}])[0].get("cpu_info") or cpu_name()
    version = res.get("llamacpp", {}).get("version", "not run")
    print(f"{model.name}, CPU ({cpu}), {args.threads} threads; llama.cpp {version}; "
          f"decode: {args.new_tokens} new tokens; medians of {args.reps} rep(s)")  # fmt: skip
    print(render(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
