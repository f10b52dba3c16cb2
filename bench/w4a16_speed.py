"""The two W4A16 kernels (kernels.w4a16, "bytes" and "words") at the Llama-3.1-8B shape's
four linears on a GPU: each kernel's fastest configuration for one row of x (the engine's
load-time choice among the same candidates), its bandwidth over the bytes a GEMV must read,
that configuration at a verification's 4 rows, and each kernel against the torch reference.

    python3 -m bench.w4a16_speed --json $OUT/w4a16_speed.json   # (bash bench/gpu.sh kernels 6)

The floor is the packed weight, its scales and zero points read at the copy bandwidth
measured in the same run (bench.gpu_decode.hbm_bandwidth).
"""

from __future__ import annotations

import argparse
import json

import torch

SHAPES = ("6144x4096", "4096x4096", "28672x4096", "4096x14336")  # qkv, o, gate_up, down
VERIFY_ROWS = 4


def weight_bytes(n: int, k: int) -> int:
    """What one GEMV reads of the weight: 4 bits a weight, a bf16 scale and zero point a
    group of 32."""
    return n * k // 2 + 2 * 2 * n * (k // 32)


def shape_rows(n: int, k: int, copy_bw: float) -> list[dict]:
    """One row per kernel: its fastest configuration and what it reaches."""
    from kernels.w4a16 import KERNELS, candidates, launch, pack_int4, time_configs
    from kernels.w4a16 import w4a16_reference as reference

    g = torch.Generator(device="cuda").manual_seed(n + k)
    q = torch.randint(0, 16, (n, k), device="cuda", generator=g, dtype=torch.uint8)
    packed = pack_int4(q)
    scale = (torch.rand(n, k // 32, device="cuda", generator=g) * 0.02 + 1e-3).bfloat16()
    zero = (torch.randn(n, k // 32, device="cuda", generator=g) * 0.01).bfloat16()
    x = torch.randn(VERIFY_ROWS, k, device="cuda", generator=g).bfloat16()
    ref = reference(x, packed, scale, zero).float()
    floor_ms = weight_bytes(n, k) / copy_bw * 1e3
    out = []
    for kernel in KERNELS:
        configs = [c for c in candidates(n, k, KERNELS) if c[4] == kernel]
        times = time_configs(x[:1].contiguous(), packed, scale, zero, configs)
        row = {"shape": f"{n}x{k}", "kernel": kernel, "configs_timed": len(times),
               "configs": len(configs), "floor_ms": floor_ms}  # fmt: skip
        if not times:
            out.append(row | {"error": "no configuration built"})
            continue
        best = min(times, key=times.get)
        ms = times[best]
        rows_ms = time_configs(x, packed, scale, zero, [best])[best]
        err = (launch(x, packed, scale, zero, best, VERIFY_ROWS).float() - ref).abs().max()
        out.append(row | {
            "config": list(best), "ms": ms, "gb_s": weight_bytes(n, k) / ms / 1e6,
            "x_floor": ms / floor_ms, f"ms_{VERIFY_ROWS}_rows": rows_ms,
            "max_abs_err": err.item(), "ok": err.item() < 0.02 * ref.abs().max().item(),
        })  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="NxK weight shapes")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.w4a16_speed: needs a GPU (the kernels' instructions without "
                         "one: python -m bench.w4a16_sass)")  # fmt: skip
    from bench.gpu_decode import hbm_bandwidth

    copy_bw = hbm_bandwidth()
    rows = []
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    print(
        f"| shape | kernel | config | ms (1 row) | GB/s | x floor | ms ({VERIFY_ROWS} rows) | ok |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        for r in shape_rows(n, k, copy_bw):
            rows.append(r)
            if "error" in r:
                print(f"| {r['shape']} | {r['kernel']} | {r['error']} | | | | | no |")
                continue
            print(f"| {r['shape']} | {r['kernel']} | {tuple(r['config'][:4])} | {r['ms']:.4f} | "
                  f"{r['gb_s']:.0f} | {r['x_floor']:.2f} | {r[f'ms_{VERIFY_ROWS}_rows']:.4f} | "
                  f"{'yes' if r['ok'] else 'NO'} |", flush=True)  # fmt: skip
    for kernel in ("bytes", "words"):
        mine = [r for r in rows if r["kernel"] == kernel and "ms" in r]
        if args.shapes == list(SHAPES) and len(mine) == len(SHAPES):  # (the 8B's 32 layers)
            total = sum(r["ms"] for r in mine)
            print(f"{kernel}: the four GEMVs of a layer {total * 1e3:.1f} us, x32 layers "
                  f"{total * 32:.3f} ms")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "copy_gb_s": copy_bw / 1e9,
                       "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
