"""A real GGUF through the engine on the GPU, against the same engine's fp32 output on the CPU.

Two steps, because the reference must come from the CPU of the machine we develop on:

    # here (CPU, exact fp32, dense weights): greedy tokens and the top logits along them
    python -m bench.gpu_real_model ref --model MODEL.gguf --out ref.json [--tokens 48] \
        [--book ../shared/data/books/moby_dick.txt --book-out book_ids.json]
    # on the GPU machine, in one process
    python -m bench.gpu_real_model run --model MODEL.gguf --ref ref.json \
        [--dtypes bfloat16 float32] [--book-ids book_ids.json] [--context 32768] \
        [--sparse 0.02] [--tiers 0.05 0.25] [--json OUT.json]

`run` does, for each of --dtypes:
- greedy decoding of the reference's prompts (the same token ids), one request at a time,
  CUDA graphs on: identical to the CPU tokens, or the first position where they differ;
- at that position, the CPU's top-2 margin (fp32 logits) and this dtype's logits there,
  teacher-forced on the CPU's tokens; and over every generated position, teacher-forced, how
  often this dtype's argmax equals the CPU's and how far its logits are from the CPU's (at
  the CPU's top-5 tokens). A divergence is "within precision" when the CPU's margin there
  is smaller than the largest such logit error: the two paths disagree only where the
  model's own choice is closer than the rounding of this dtype.
Then, with --book-ids (real text, tokenized here):
- dense decode tok/s at --context tokens of context (batch 1, CUDA graphs);
- sparse decode with --sparse of the pages selected, under GPU tiers of --tiers of the
  context's KV: page-selection locality, the share of new pages that were read before
  (recurring), the host fetch fraction, and decode tok/s.
Prints a table last and writes everything to --json. Imports torch, transformers, numpy,
safetensors, and gguf (for the GGUF's conversion, once).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What does `git rebase -i` do? Answer in two sentences.",
    "Explain the difference between a list and a tuple in Python.",
]
TOP = 5  # logits kept per generated position in the reference
NEW_DECODE = 64  # tokens decoded per speed measurement


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


YARN = None  # run --yarn F: RoPE stretched by F over the trained window (EngineConfig.rope_scaling)


def load(model: str, device: str, dtype: str, **config):
    from engine import Engine, EngineConfig

    if YARN:
        config["rope_scaling"] = {"rope_type": "yarn", "factor": YARN}
    return Engine.load(model, device=device, dtype=dtype, weights="dense",
                       config=EngineConfig(**config))  # fmt: skip


def greedy(engine, prompt_ids: list[int], n: int) -> list[int]:
    from engine import SamplingParams

    return engine.generate([prompt_ids], SamplingParams(max_tokens=n))[0].token_ids


def forced_logits(engine, prompt_ids: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens), V]: row j is the logits that predict tokens[j] after prompt + tokens[:j]."""
    from engine.runtime.llm_engine import prompt_logits

    full = prompt_logits(engine, prompt_ids + tokens[:-1])
    return full[len(prompt_ids) - 1 :].cpu()


# ---- ref: the CPU side ---------------------------------------------------------------------


def make_ref(args) -> dict:
    engine = load(args.model, "cpu", "float32", max_model_len=4096, max_num_seqs=1)
    items = []
    for text in PROMPTS:
        ids = engine.chat_tokens([{"role": "user", "content": text}])
        tokens = greedy(engine, ids, args.tokens)
        logits = forced_logits(engine, ids, tokens)
        top = logits.topk(TOP, dim=-1)
        items.append({"prompt": text, "prompt_ids": ids, "tokens": tokens,
                      "text": engine.decode(tokens),
                      "top_ids": top.indices.tolist(),
                      "top_logits": [[round(v, 5) for v in row] for row in top.values.tolist()],
                      "forced_argmax_equals_greedy": [int(logits[j].argmax()) == t
                                                      for j, t in enumerate(tokens)]})  # fmt: skip
        print(f"{len(ids)} prompt tokens -> {engine.decode(tokens)!r}", flush=True)
    ref = {"model": Path(args.model).name, "model_sha256": sha256(Path(args.model)),
           "device": "cpu", "dtype": "float32", "weights": engine.weights_mode,
           "torch": torch.__version__, "items": items}  # fmt: skip
    if args.book:
        text = Path(args.book).read_text(encoding="utf-8")[
            args.offset : args.offset + 8 * args.book_tokens
        ]
        ids = engine.encode(text)[: args.book_tokens]
        Path(args.book_out).write_text(json.dumps({"source": Path(args.book).name,
                                                   "offset": args.offset, "ids": ids}))  # fmt: skip
        print(f"{len(ids)} book tokens -> {args.book_out}")
    return ref


# ---- run: the device side ------------------------------------------------------------------


def compare(engine, item: dict, n: int) -> dict:
    ids, ref = item["prompt_ids"], item["tokens"]
    ours = greedy(engine, ids, n)
    first = next((j for j, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), None)
    if first is None and len(ours) != len(ref):
        first = min(len(ours), len(ref))  # one stopped (EOS) where the other went on
    logits = forced_logits(engine, ids, ref)
    top_ids = torch.tensor(item["top_ids"])
    err = (logits.gather(1, top_ids) - torch.tensor(item["top_logits"])).abs()
    agree = [int(logits[j].argmax()) == int(top_ids[j, 0]) for j in range(len(ref))]
    row = {"identical": first is None, "first_divergence": first, "tokens": ours,
           "text": engine.decode(ours), "forced_argmax_agreement": sum(agree) / len(agree),
           "max_logit_error": float(err.max()), "mean_logit_error": float(err.mean())}  # fmt: skip
    if first is not None and first < len(ref):
        cpu = item["top_logits"][first]
        here = logits[first].topk(2)
        row["at_divergence"] = {
            "cpu_top2": item["top_ids"][first][:2], "cpu_margin": cpu[0] - cpu[1],
            "ours_top2": here.indices.tolist(),
            "ours_margin": float(here.values[0] - here.values[1]),
            "ours_greedy_token": ours[first] if first < len(ours) else None,
            "within_precision": cpu[0] - cpu[1] < float(err.max()),
        }  # fmt: skip
    return row


def check(args, ref: dict, dtype: str) -> dict:
    torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    engine = load(args.model, args.device, dtype, max_model_len=4096, max_num_seqs=1)
    out = {"dtype": dtype, "load_s": time.perf_counter() - t0, "prompts": []}
    for item in ref["items"]:
        out["prompts"].append(compare(engine, item, len(item["tokens"])))
    out["peak_gib"] = (
        torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    )
    del engine
    free_gpu()
    return out


def decode_speed(args, ids: list[int]) -> dict:
    from bench.e2e_sparse import timed_decode

    n = min(len(ids), args.context - NEW_DECODE - 16)
    engine = load(args.model, args.device, "bfloat16" if args.device == "cuda" else "float32",
                  max_model_len=n + NEW_DECODE + 16, max_num_seqs=1,
                  max_num_batched_tokens=8192)  # fmt: skip
    timed_decode(engine, [ids[:256]], 8)  # warm-up: kernels compile, graphs captured
    runs = []
    for _ in range(2):
        engine.block_manager.reset_prefix_cache()
        runs.append(timed_decode(engine, [ids[:n]], NEW_DECODE))
    best = max(runs, key=lambda r: r["decode_tok_s"])
    out = {"context": n, **best, "runs_tok_s": [r["decode_tok_s"] for r in runs],
           "params": engine.model_config.num_params}  # fmt: skip
    del engine
    free_gpu()
    return out


def sparse_locality(args, ids: list[int], tier_frac: float, eviction: str = "value") -> dict:
    from engine import SamplingParams
    from engine.kv import SparseConfig
    from engine.kv.pool import KVCache

    n = min(len(ids), args.context - NEW_DECODE - 16)
    from engine.loading.loader import read_config, resolve_source

    mc = read_config(resolve_source(args.model))  # the config alone, no weights
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    kv_bytes = KVCache.bytes_per_page(mc, 16, dtype) * -(-n // 16)
    sparse = SparseConfig(budget_fraction=args.sparse, gpu_kv_budget=int(kv_bytes * tier_frac),
                          eviction=eviction)  # fmt: skip
    engine = load(args.model, args.device, str(dtype).split(".")[1], sparse=sparse,
                  max_model_len=n + NEW_DECODE + 16, max_num_seqs=1,
                  max_num_batched_tokens=8192)  # fmt: skip
    req = engine.add_request(ids[:n], SamplingParams(max_tokens=NEW_DECODE + 2, ignore_eos=True))
    while req.stats.completion_tokens < 2:  # the first steps fill the empty tier
        engine.step()
    tiers = engine.runner.tiers
    tiers.reset_stats()
    sync()
    t0, done0 = time.perf_counter(), req.stats.completion_tokens
    while not req.done:
        engine.step()
    sync()
    tok_s = (req.stats.completion_tokens - done0) / (time.perf_counter() - t0)
    st = tiers.stats
    new = st.locality_total - st.locality_hits
    out = {"context": n, "budget": args.sparse, "tier_fraction": tier_frac, "eviction": eviction,
           "tier_slots_per_layer": tiers.num_slots, "locality": st.locality,
           "recurring": 1 - st.fetched / max(1, new), "fetch_fraction": st.fetch_fraction,
           "fetched_mb_per_token": st.fetched_bytes / max(1, st.steps) * tiers.L / 1e6,
           "selected_per_layer_step": st.selected / max(1, st.steps), "decode_tok_s": tok_s,
           "evicted": st.evicted}  # fmt: skip
    del engine
    free_gpu()
    return out


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free_gpu() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(args) -> dict:
    """Every section in turn; --json is rewritten after each, so a run stopped at its time
    limit still leaves what it measured."""
    ref = json.loads(Path(args.ref).read_text())
    out = {"model": Path(args.model).name, "model_sha256": sha256(Path(args.model)),
           "ref_model_sha256": ref["model_sha256"], "device": args.device,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "torch": torch.__version__, "ref_torch": ref["torch"], "yarn": args.yarn,
           "checks": []}  # fmt: skip
    if out["model_sha256"] != ref["model_sha256"]:
        raise SystemExit("gpu_real_model: the model is not the file the reference was made from")
    for dtype in args.dtypes:
        out["checks"].append(check(args, ref, dtype))
        save(args, out)
        print(json.dumps(out["checks"][-1], default=str)[:600], flush=True)
    if args.book_ids:
        ids = json.loads(Path(args.book_ids).read_text())["ids"]
        if not args.skip_speed:
            out["decode"] = decode_speed(args, ids)
            save(args, out)
            print(json.dumps(out["decode"]), flush=True)
        out["sparse"] = []
        for frac in args.tiers:
            for eviction in args.evictions:
                out["sparse"].append(sparse_locality(args, ids, frac, eviction))
                save(args, out)
                print(json.dumps(out["sparse"][-1]), flush=True)
    return out


def save(args, out: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


def table(out: dict) -> str:
    lines = [f"{out['model']} on {out['gpu'] or out['device']}"]
    if out["checks"]:
        lines[0] += ", against the CPU fp32 reference"
        lines.append(f"{'dtype':<9} {'prompt':>6} {'identical':>9} {'diverges at':>11} "
                     f"{'cpu margin':>10} {'max |dlogit|':>12} {'forced agree':>12}")  # fmt: skip
    for c in out["checks"]:
        for i, p in enumerate(c["prompts"]):
            d = p.get("at_divergence") or {}
            margin = f"{d['cpu_margin']:.3f}" if d else "-"
            at = "-" if p["first_divergence"] is None else str(p["first_divergence"])
            lines.append(f"{c['dtype']:<9} {i:>6} {str(p['identical']):>9} {at:>11} "
                         f"{margin:>10} {p['max_logit_error']:>12.3f} "
                         f"{p['forced_argmax_agreement']:>12.1%}")  # fmt: skip
    if d := out.get("decode"):
        lines.append(f"dense decode, {d['context']:,} tokens of context, batch 1: "
                     f"{d['decode_tok_s']:.1f} tok/s (prefill {d['prefill_s']:.2f} s)")  # fmt: skip
    if out.get("sparse"):
        lines.append(f"{'sparse':>6} {'tier':>5} {'evict':>5} {'slots':>6} {'locality':>8} "
                     f"{'recurring':>9} {'fetched':>7} {'MB/token':>8} {'tok/s':>7}")  # fmt: skip
        for s in out["sparse"]:
            lines.append(f"{s['budget']:>6.0%} {s['tier_fraction']:>5.0%} "
                         f"{s.get('eviction', 'value'):>5} "
                         f"{s['tier_slots_per_layer']:>6} {s['locality']:>8.1%} "
                         f"{s['recurring']:>9.1%} {s['fetch_fraction']:>7.1%} "
                         f"{s['fetched_mb_per_token']:>8.2f} {s['decode_tok_s']:>7.1f}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("ref", help="the CPU reference")
    r.add_argument("--model", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--tokens", type=int, default=48)
    r.add_argument("--book", default=None, help="also tokenize a slice of this text")
    r.add_argument("--offset", type=int, default=200000, help="characters into the book")
    r.add_argument("--book-tokens", type=int, default=32768)
    r.add_argument("--book-out", default="book_ids.json")
    g = sub.add_parser("run", help="the check (and speed, locality) on a device")
    g.add_argument("--model", required=True)
    g.add_argument("--ref", required=True)
    g.add_argument("--device", default="cuda")
    g.add_argument(
        "--dtypes",
        nargs="*",
        default=["bfloat16", "float32"],
        help="the greedy check's dtypes (none: skip it)",
    )
    g.add_argument("--book-ids", default=None)
    g.add_argument("--context", type=int, default=32768)
    g.add_argument(
        "--yarn",
        type=float,
        default=None,
        help="YaRN RoPE scaling by this factor (Qwen2.5 past 32K: 4)",
    )
    g.add_argument("--sparse", type=float, default=0.02, help="page budget of sparse decode")
    g.add_argument("--tiers", type=float, nargs="*", default=[0.05, 0.25],
                   help="GPU tier sizes, as fractions of the context's KV")  # fmt: skip
    g.add_argument(
        "--evictions",
        nargs="+",
        default=["value"],
        choices=["value", "clock"],
        help="the GPU tier's eviction in the sparse rows (each its own run)",
    )
    g.add_argument("--skip-speed", action="store_true", help="no dense decode speed row")
    g.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    for path in [args.model] + ([args.ref] if args.cmd == "run" else []):
        if not Path(path).is_file():
            print(f"gpu_real_model: no such file: {path}", file=sys.stderr)
            return 2
    if args.cmd == "ref":
        Path(args.out).write_text(json.dumps(make_ref(args)))
        print(f"reference -> {args.out}")
        return 0
    global YARN
    YARN = args.yarn
    out = run(args)
    print("\n" + table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
