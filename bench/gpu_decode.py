"""GPU decode benchmark and checks.

1. Correctness on the GPU: the paged decode kernel against its torch reference at real
   shapes (bf16), and a tiny random Llama checkpoint (fp32) through the whole engine, CUDA
   graphs included, against transformers: logits and greedy tokens, batched and alone.
2. Speed: dummy weights of the Llama-3.1-8B shape, bf16, batch 1, 4K context. Ours (paged
   KV, Triton paged decode, CUDA graphs) against transformers `generate` (SDPA, static
   cache) in the same process, with the weight-read floor beside them.

    python -m bench.gpu_decode [--context 4096] [--new-tokens 128] [--json OUT.json]
    python -m bench.gpu_decode --preset smollm2-135m --device cpu --context 256   # smoke test
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time

import torch


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def hbm_bandwidth() -> float:
    """Measured device-to-device copy bandwidth, bytes/s (read + write)."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    return 2 * n / sorted(times)[len(times) // 2]


def check_kernel(rows: list[dict], device: str) -> None:
    from kernels.paged_decode import paged_decode_attention, paged_decode_reference
    from kernels.views import PagedKV

    torch.manual_seed(0)
    shapes = ((1, 4096), (4, 32768), (8, 4099)) if device == "cuda" else ((2, 100),)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for batch, ctx in shapes:
        P, Hkv, Hq, D = 16, 8, 32, 128
        pages_per_seq = -(-ctx // P)
        kv = torch.randn(batch * pages_per_seq + 3, Hkv, 2, P, D, device=device, dtype=dtype)
        tables = (
            torch.randperm(batch * pages_per_seq, device=device).int().view(batch, pages_per_seq)
        )
        lens = torch.tensor([ctx - 7 * i for i in range(batch)], device=device, dtype=torch.int32)
        q = torch.randn(batch, Hq, D, device=device, dtype=dtype)
        cache = PagedKV(kv, tables, lens)
        out = paged_decode_attention(q, cache, D**-0.5)
        ref = paged_decode_reference(q, cache, D**-0.5)
        err = (out.float() - ref.float()).abs().max().item()
        rows.append(
            {
                "check": f"paged decode kernel vs reference, batch {batch}, ctx {ctx}, {dtype}",
                "max_abs_err": err,
                "ok": err < 2e-2,
            }
        )


def time_kernel_in_graph(device: str) -> dict:
    """Paged decode attention for the 32 layers of one Llama-8B decode step (batch 1, 4K
    tokens), captured in a CUDA graph as the engine runs it: split merge fused into the
    attention kernel, or as a second kernel."""
    from kernels.paged_decode import paged_decode_attention
    from kernels.views import PagedKV

    P, Hkv, Hq, D, ctx = 16, 8, 32, 128, 4096
    pages = ctx // P
    kvs = [
        torch.randn(pages + 1, Hkv, 2, P, D, device=device, dtype=torch.bfloat16) for _ in range(32)
    ]
    table = torch.randperm(pages, device=device).int()[None]
    lens = torch.tensor([ctx], device=device, dtype=torch.int32)
    q = torch.randn(1, Hq, D, device=device, dtype=torch.bfloat16)
    counters = torch.zeros(4096, dtype=torch.int32, device=device)  # the fused merge's (zeros)
    out = {}
    for fused in (True, False):

        def step(fused=fused):
            for kv in kvs:
                paged_decode_attention(q, PagedKV(kv, table, lens), D**-0.5, fused=fused,
                                       counters=counters)  # fmt: skip

        step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        end.synchronize()
        out["fused" if fused else "two kernels"] = (
            start.elapsed_time(end) / 20 / 32 * 1e3
        )  # us per layer
    print(
        f"paged decode attention per layer in a graph (4K tokens, batch 1): fused merge "
        f"{out['fused']:.1f} us, separate combine {out['two kernels']:.1f} us",
        flush=True,
    )
    return out


def check_w4a16(rows: list[dict], device: str) -> None:
    """The W4A16 kernel against its torch reference at the 8B shape's linears."""
    from engine.loading.int4_groups import int4_groups
    from kernels.w4a16 import KERNELS, candidates, launch, pack_int4, w4a16, w4a16_reference

    g = torch.Generator(device=device).manual_seed(0)
    for t, n, k in ((1, 6144, 4096), (1, 4096, 14336), (5, 28672, 4096)):
        q, scale, zero = int4_groups(torch.randn(n, k, device=device, generator=g) * 0.02)
        packed, dt = pack_int4(q), torch.bfloat16 if device == "cuda" else torch.float32
        x = torch.randn(t, k, device=device, generator=g).to(dt)
        scale, zero = scale.to(dt), zero.to(dt)
        ref = w4a16_reference(x, packed, scale, zero)
        outs = {"chosen": w4a16(x, packed, scale, zero, use_triton=device == "cuda")}
        if device == "cuda":  # each kernel's first configuration too
            for kernel in KERNELS:
                first = next(c for c in candidates(n, k, KERNELS) if c[4] == kernel)
                try:
                    outs[f"config {first}"] = launch(x, packed, scale, zero, first, t).to(dt)
                except Exception as e:  # noqa: BLE001 (a kernel this Triton cannot build)
                    rows.append({"check": f"w4a16 {t}x{k} -> {n} (config {first}) builds",
                                 "ok": False, "error": f"{type(e).__name__}: {e}"[:300]})  # fmt: skip
        for label, ours in outs.items():
            err = (ours.float() - ref.float()).abs().max().item()
            rows.append({"check": f"w4a16 {t}x{k} -> {n} ({label}) vs reference",
                         "max_abs_err": err, "ok": err < 0.05 * ref.float().abs().max().item()})  # fmt: skip


def check_engine_vs_transformers(rows: list[dict], device: str) -> None:
    """A tiny random Llama in fp32 through our engine (graphs on) against transformers."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from engine import Engine, EngineConfig, SamplingParams
    from engine.runtime.llm_engine import prompt_logits

    cfg = LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
        hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).to(device).eval()
        engine = Engine.load(d, device=device, dtype="float32", config=EngineConfig(max_num_seqs=8))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (7, 100, 33, 260)]
    with torch.no_grad():
        ref_logits = hf(torch.tensor([prompts[1]], device=device)).logits[0].float()
        ref_tokens = [
            hf.generate(torch.tensor([p], device=device), max_new_tokens=32, min_new_tokens=32, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]  # fmt: skip
    err = (prompt_logits(engine, prompts[1]) - ref_logits).abs().max().item()
    rows.append(
        {"check": "tiny Llama fp32 logits vs transformers", "max_abs_err": err, "ok": err < 1e-4}
    )
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    alone = [engine.generate([p], params)[0].token_ids for p in prompts]
    together = [c.token_ids for c in engine.generate(prompts, params)]
    rows.append(
        {
            "check": "tiny Llama greedy 32 tokens (graphs) == transformers, 4 prompts",
            "ok": alone == ref_tokens,
        }
    )
    rows.append({"check": "batched (4) == alone", "ok": together == alone})
    rows.append(
        {"check": "CUDA graphs in use", "ok": bool(decode_graphs(engine)) or device != "cuda"}
    )
    ahead = engine.steps_launched_ahead
    rows.append(
        {"check": f"decode steps launched ahead: {ahead}", "ok": ahead > 0 or device != "cuda"}
    )
    # sequences ending at different steps change the batch under a step launched ahead
    mixed = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (5, 32, 17, 1)]
    cut = [c.token_ids for c in engine.generate(prompts, mixed)]
    same = all(c == a[: len(c)] for c, a in zip(cut, alone, strict=True))
    rows.append(
        {
            "check": "uneven max_tokens in one batch == prefixes of alone",
            "ok": same and [len(c) for c in cut] == [5, 32, 17, 1],
        }
    )


def decode_graphs(engine) -> dict:
    """The decode graphs the engine captured, by key (none without CUDA graphs)."""
    graphs = engine.runner.decode_graphs
    return graphs.graphs if graphs is not None else {}


def profile_decode(engine) -> None:
    """Per-kernel GPU time of one decode forward, run eagerly (launch gaps aside, the same kernels)."""
    from torch.profiler import ProfilerActivity, profile

    runner = engine.runner
    for _ in range(3):
        runner.decode_graphs.forward(1)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            runner.decode_graphs.forward(1)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20), flush=True)


def bench_ours(preset: str, device: str, context: int, new_tokens: int,
               weights: str = "dense") -> dict:  # fmt: skip
    from engine import Engine, EngineConfig, SamplingParams

    cfg = EngineConfig(
        max_num_seqs=1, max_model_len=context + new_tokens + 64, max_num_batched_tokens=8192
    )
    sync(device)
    t0 = time.perf_counter()
    engine = Engine.load(
        f"dummy:{preset}",
        device=device,
        dtype="bfloat16" if device == "cuda" else "float32",
        config=cfg,
        weights=weights,
    )
    sync(device)
    load_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, engine.model_config.vocab_size, (context,), generator=g).tolist()
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    engine.generate([prompt[:256]], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
    runs = []
    for _ in range(2):
        engine.block_manager.reset_prefix_cache()
        runs.append(engine.generate([prompt], params)[0].stats)
    best = min(runs, key=lambda s: s.total_s - s.ttft_s)
    replay_ms = None
    if device == "cuda" and decode_graphs(engine):
        # GPU time of one decode forward alone: the gap to the step time is host work
        graph = decode_graphs(engine)[1]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(50):
            graph.replay()
        end.record()
        end.synchronize()
        replay_ms = start.elapsed_time(end) / 50
        if os.environ.get("AGENTCTX_PROFILE"):
            profile_decode(engine)
        if os.environ.get("AGENTCTX_PROFILE_HOST"):
            import cProfile
            import pstats

            engine.block_manager.reset_prefix_cache()
            prof = cProfile.Profile()
            prof.enable()
            engine.generate([prompt], params)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    out = {
        "load_s": load_s,
        "prefill_s": best.ttft_s,
        "decode_ms_per_token": 1e3 / best.decode_tok_s,
        "all_runs_decode_ms": [1e3 / s.decode_tok_s for s in runs],
        "graph_replay_ms": replay_ms,
        "params": engine.model_config.num_params,
        "weights": engine.weights_mode,
        # what a decode step must read of the weights: every parameter and buffer but the
        # embedding table (one row of it a token)
        "weight_bytes": sum(
            t.numel() * t.element_size()
            for n, t in [*engine.model.named_parameters(), *engine.model.named_buffers()]
            if not n.startswith("embed_tokens") or engine.model_config.tie_word_embeddings
        ),
        "graphs": sorted(decode_graphs(engine)),
    }
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def bench_transformers(preset: str, device: str, context: int, new_tokens: int) -> dict:
    """transformers `generate`, greedy, SDPA; static cache (its auto-compile turned off, so
    compilation time is not measured) and the default dynamic cache."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.loading.loader import DUMMY_PRESETS

    hf_cfg = LlamaConfig(**{k: v for k, v in DUMMY_PRESETS[preset].items() if k != "architectures"})
    hf_cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = (
            LlamaForCausalLM(hf_cfg)
            .to(torch.bfloat16 if device == "cuda" else torch.float32)
            .eval()
        )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, hf_cfg.vocab_size, (1, context), generator=g).to(device)

    def run(n: int, cache: str | None, model=model) -> float:
        kwargs = {"cache_implementation": cache, "disable_compile": True} if cache else {}
        sync(device)
        t = time.perf_counter()
        model.generate(
            ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, **kwargs
        )
        sync(device)
        return time.perf_counter() - t

    out = {}
    for label, cache in (("static", "static"), ("dynamic", None)):
        run(4, cache)  # warm-up
        t1 = min(run(1, cache) for _ in range(2))
        tn = run(new_tokens, cache)
        out[label] = {"prefill_s": t1, "decode_ms_per_token": 1e3 * (tn - t1) / (new_tokens - 1)}
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument(
        "--weights",
        nargs="+",
        default=["dense"],
        choices=["dense", "int4"],
        help="int4: every layer's linears as 4-bit groups (W4A16 kernel)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows: list[dict] = []
    check_kernel(rows, args.device)
    if "int4" in args.weights:
        check_w4a16(rows, args.device)
    check_engine_vs_transformers(rows, args.device)
    tuning = time_kernel_in_graph(args.device) if args.device == "cuda" else {}
    for r in rows:
        err = f"  max abs err {r['max_abs_err']:.2e}" if "max_abs_err" in r else ""
        err += f"  {r['error']}" if "error" in r else ""
        print(f"[{'ok' if r['ok'] else 'FAIL'}] {r['check']}{err}", flush=True)
    bw = hbm_bandwidth() if args.device == "cuda" else None
    ours_by = {w: bench_ours(args.preset, args.device, args.context, args.new_tokens, w)
               for w in args.weights}  # fmt: skip
    ours = ours_by[args.weights[0]]
    if "int4" in args.weights:
        from kernels.w4a16 import timed_configs

        ours_by["int4"]["w4a16_chosen"] = timed_configs()  # the blocks timed per shape
    hf = bench_transformers(args.preset, args.device, args.context, args.new_tokens)
    weight_bytes = ours["params"] * (2 if args.device == "cuda" else 4)
    floor_ms = 1e3 * weight_bytes / bw if bw else float("nan")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    result = {"device": name, "hbm_bandwidth_GBps": (bw or 0) / 1e9, "weight_bytes": weight_bytes,
              "floor_ms": floor_ms, "ours": ours, "ours_by_weights": ours_by, "transformers": hf, "checks": rows, "args": vars(args), "kernel_tuning": tuning}  # fmt: skip
    print(
        f"\n{args.preset} shape, batch 1, context {args.context}, {args.new_tokens} new tokens, {name}"
    )
    if bw:
        print(
            f"HBM copy bandwidth {bw / 1e9:.0f} GB/s; weights {weight_bytes / 1e9:.2f} GB; floor {floor_ms:.2f} ms/token"
        )
    print(f"{'':30s}{'decode ms/tok':>14s}{'x floor':>9s}{'prefill s':>11s}")
    rows_out = [(f"agentctx {r['weights']} (paged, graphs)", r) for r in ours_by.values()]
    rows_out += [(f"transformers ({k} cache, SDPA)", v) for k, v in hf.items()]
    for label, r in rows_out:
        ms = r["decode_ms_per_token"]
        print(f"{label:30s}{ms:14.2f}{ms / floor_ms:9.2f}{r['prefill_s']:11.3f}")
    for w, r in ours_by.items():
        own = 1e3 * r["weight_bytes"] / bw if bw else float("nan")
        print(f"agentctx {w}: reads {r['weight_bytes'] / 1e9:.2f} GB a token; its own floor "
              f"{own:.2f} ms; {r['decode_ms_per_token'] / own:.2f}x it")  # fmt: skip
        if r.get("w4a16_chosen"):
            print(f"  W4A16 (BLOCK_N, BLOCK_K, SPLIT_K, warps) per shape: "
                  f"{r['w4a16_chosen']}")  # fmt: skip
    if ours.get("graph_replay_ms"):
        print(f"decode forward alone (graph replay): {ours['graph_replay_ms']:.2f} ms")
    for k, v in hf.items():
        ratio = v["decode_ms_per_token"] / ours["decode_ms_per_token"]
        print(f"decode speedup vs transformers {k}: {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
