"""The paged decode attention kernel's split count and block size, swept on the GPU: each
configuration checked against the torch reference, then timed as a decode step runs it
(kernel and combine in a CUDA graph, the Llama-3.1-8B head shape, batch 1).

python3 -m bench.decode_attention_sweep [--contexts 4096 32768] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from kernels.paged_decode import default_num_splits, paged_decode_attention, paged_decode_reference
from kernels.views import PagedKV

HQ, HKV, D, P = 32, 8, 128, 16  # Llama-3.1-8B's heads, 16-token pages
REPLAYS = 50


def cache_for(context: int, device) -> tuple[torch.Tensor, PagedKV]:
    pages = -(-context // P)
    gen = torch.Generator(device="cpu").manual_seed(context)
    kv = torch.randn(pages + 8, HKV, 2, P, D, generator=gen).to(device, torch.bfloat16)
    order = torch.randperm(pages + 8, generator=gen)[:pages]  # pages scattered in the pool
    block_tables = order.to(torch.int32)[None].to(device)
    lens = torch.tensor([context], dtype=torch.int32, device=device)
    q = torch.randn(1, HQ, D, generator=gen).to(device, torch.bfloat16)
    return q, PagedKV(kv, block_tables, lens)


def time_us(fn) -> float:
    """Mean microseconds of one call, replayed in a CUDA graph of REPLAYS calls."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # compile and warm up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPLAYS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = math.inf
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / REPLAYS)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--splits", type=int, nargs="+", default=[8, 16, 33, 66, 132])
    ap.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device("cuda")
    default = default_num_splits(1, HKV, device)
    rows = []
    for context in args.contexts:
        q, cache = cache_for(context, device)
        scale = D**-0.5
        ref = paged_decode_reference(q.float(), PagedKV(cache.kv.float(), cache.block_tables,
                                                         cache.kv_lens), scale)  # fmt: skip
        kv_bytes = context * HKV * 2 * D * 2
        for splits in sorted({*args.splits, default}):
            for block in args.blocks:
                out = paged_decode_attention(q, cache, scale, num_splits=splits, block_n=block)
                err = (out.float() - ref).abs().max().item()
                us = time_us(lambda s=splits, b=block: paged_decode_attention(
                    q, cache, scale, num_splits=s, block_n=b))  # fmt: skip
                rows.append({"context": context, "splits": splits, "block_n": block, "us": us,
                             "max_err": err, "default": splits == default and block == 64,
                             "tb_s": kv_bytes / us / 1e6})  # fmt: skip
                print(f"{context:>7} splits {splits:>4} block {block:>4}: {us:7.2f} us "
                      f"({kv_bytes / us / 1e6:5.2f} TB/s), max err {err:.2e}"
                      + ("  (the engine's default)" if rows[-1]["default"] else ""), flush=True)  # fmt: skip
        best = min((r for r in rows if r["context"] == context), key=lambda r: r["us"])
        print(f"{context:>7} best: splits {best['splits']} block {best['block_n']}: "
              f"{best['us']:.2f} us", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "gpu": torch.cuda.get_device_name(0)}, f, indent=1)


if __name__ == "__main__":
    main()
