"""GPU decode benchmark: dummy weights of the Llama-3.1-8B shape, bf16, batch 1, 4K context.

Ours (paged KV, Triton paged decode kernel, CUDA graphs) against transformers `generate`
(SDPA, static cache) in the same process, with the weight-read floor printed beside them.
Also checks the paged decode kernel against its torch reference at real shapes.

    python -m bench.gpu_decode [--context 4096] [--new-tokens 128] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch


def hbm_bandwidth() -> float:
    """Measured device-to-device copy bandwidth, bytes/s (read + write)."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
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


def check_kernel(rows: list[dict]) -> None:
    from kernels.paged_decode import paged_decode_attention, paged_decode_reference

    torch.manual_seed(0)
    for batch, ctx in ((1, 4096), (4, 32768), (8, 4099)):
        P, Hkv, Hq, D = 16, 8, 32, 128
        pages_per_seq = -(-ctx // P)
        kv = torch.randn(
            batch * pages_per_seq + 3, Hkv, 2, P, D, device="cuda", dtype=torch.bfloat16
        )
        perm = torch.randperm(batch * pages_per_seq, device="cuda").int()
        tables = perm.view(batch, pages_per_seq)
        lens = torch.tensor([ctx - 7 * i for i in range(batch)], device="cuda", dtype=torch.int32)
        q = torch.randn(batch, Hq, D, device="cuda", dtype=torch.bfloat16)
        out = paged_decode_attention(q, kv, tables, lens, D**-0.5)
        ref = paged_decode_reference(q, kv, tables, lens, D**-0.5)
        err = (out.float() - ref.float()).abs().max().item()
        rows.append(
            {"check": f"paged decode kernel vs reference b={batch} ctx={ctx}", "max_abs_err": err}
        )
        assert err < 2e-2, err


def bench_ours(context: int, new_tokens: int) -> dict:
    from engine import Engine, EngineConfig, SamplingParams

    cfg = EngineConfig(
        max_num_seqs=1, max_model_len=context + new_tokens + 64, max_num_batched_tokens=8192
    )
    t0 = time.perf_counter()
    engine = Engine.load("dummy:llama-3.1-8b", device="cuda", dtype="bfloat16", config=cfg)
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 128000, (context,), generator=g).tolist()
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    engine.generate([prompt[:256]], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
    engine.block_manager.reset_prefix_cache()
    c = engine.generate([prompt], params)[0]
    torch.cuda.synchronize()
    engine.block_manager.reset_prefix_cache()
    # a second run, timed from its own events, to be sure the first was warm
    c2 = engine.generate([prompt], params)[0]
    stats = c2.stats
    out = {
        "load_s": load_s,
        "prefill_s": stats.ttft_s,
        "decode_ms_per_token": 1e3 / stats.decode_tok_s,
        "first_run_decode_ms": 1e3 / c.stats.decode_tok_s,
        "params": engine.model_config.num_params,
        "tokens": c2.token_ids[:8],
    }
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return out


def bench_transformers(context: int, new_tokens: int) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.loader import DUMMY_PRESETS

    hf_cfg = LlamaConfig(
        **{k: v for k, v in DUMMY_PRESETS["llama-3.1-8b"].items() if k != "architectures"}
    )
    hf_cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = LlamaForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128000, (1, context), generator=g).cuda()

    def run(n: int, model=model) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(
            ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
            cache_implementation="static", pad_token_id=0,
        )  # fmt: skip
        torch.cuda.synchronize()
        return time.perf_counter() - t

    run(4)  # warm-up
    t1 = run(1)
    tn = run(new_tokens)
    out = {"prefill_s": t1, "decode_ms_per_token": 1e3 * (tn - t1) / (new_tokens - 1)}
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows: list[dict] = []
    check_kernel(rows)
    bw = hbm_bandwidth()
    ours = bench_ours(args.context, args.new_tokens)
    hf = bench_transformers(args.context, args.new_tokens)
    weight_bytes = ours["params"] * 2
    floor_ms = 1e3 * weight_bytes / bw
    result = {
        "device": torch.cuda.get_device_name(),
        "hbm_bandwidth_GBps": bw / 1e9,
        "weight_bytes": weight_bytes,
        "floor_ms": floor_ms,
        "ours": ours,
        "transformers": hf,
        "checks": rows,
    }
    for r in rows:
        print(f"{r['check']}: max abs err {r['max_abs_err']:.2e}")
    print(
        f"\nLlama-3.1-8B shape, bf16, batch 1, context {args.context}, {args.new_tokens} new tokens, {result['device']}"
    )
    print(
        f"HBM copy bandwidth {bw / 1e9:.0f} GB/s; weights {weight_bytes / 1e9:.2f} GB; floor {floor_ms:.2f} ms/token"
    )
    print(f"{'':28s}{'decode ms/tok':>14s}{'x floor':>9s}{'prefill s':>11s}")
    for name, r in (("agentctx (paged, graphs)", ours), ("transformers static+SDPA", hf)):
        print(
            f"{name:28s}{r['decode_ms_per_token']:14.2f}{r['decode_ms_per_token'] / floor_ms:9.2f}{r['prefill_s']:11.3f}"
        )
    print(
        f"speedup vs transformers: {hf['decode_ms_per_token'] / ours['decode_ms_per_token']:.2f}x"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
