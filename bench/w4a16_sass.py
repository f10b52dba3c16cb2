"""What the W4A16 kernels compile to for the H200 (sm_90), without a GPU: each kernel's K loop
in SASS, its instructions a weight by kind, and the issue-slot estimate that follows.

    .venv/bin/python -m bench.w4a16_sass --json docs/w4a16_sass.json

A decode step's int4 GEMVs are bound by instructions, not bytes, when a loop spends more
issue slots a weight than the bytes allow: at 4.1 TB/s and 5 bits a weight the H200 streams
~6.6 T weights a second, and its 132 SMs issue ~33 T thread-instructions a second (4 warp
schedulers each at ~1.98 GHz), ~5 a weight; a conversion (I2F) issues at 16 lanes a clock per
SM, an eighth of an FFMA's rate. These are counts of the compiler's output, not timings: the
GPU times the kernels against each other at load (kernels.w4a16._config) and keeps the faster.

Arguments are compiled as the launches specialize them (pointers and the strides, K and N
multiples of 16), with the blocks the H200 chose for the 8B shape's linears.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import tempfile

# the H200's per-SM rates (lanes a clock) by pipe, for the estimate (CUDA C++ Programming
# Guide, arithmetic instruction throughput, compute capability 9.0)
ISSUE_LANES = 128  # 4 schedulers x 32 lanes
CONVERSION_LANES = 16  # I2F, F2I and other 32-bit conversions
CONVERSIONS = ("I2F", "I2FP", "F2I", "F2F")
SIGNATURE = {"X": "*bf16", "PACKED": "*u8", "SCALE": "*bf16", "ZERO": "*bf16", "OUT": "*bf16",
             "T": "i32", "N": "i32", "K": "i32", "K_SHARE": "i32", "stride_x": "i32",
             "stride_p": "i32", "stride_s": "i32", "stride_os": "i32", "stride_ot": "i32"}  # fmt: skip
DIVISIBLE = ("X", "PACKED", "SCALE", "ZERO", "OUT", "N", "K", "K_SHARE", "stride_x", "stride_p",
             "stride_s", "stride_os", "stride_ot")  # fmt: skip
# (BLOCK_N, BLOCK_K, num_warps): the H200's choices for the 8B's four linears and a shorter K
# block
BLOCKS = ((16, 1024, 4), (16, 1024, 8), (32, 1024, 4), (64, 1024, 8), (32, 256, 4))


def kernel_signature(kernel: str) -> dict[str, str]:
    """The byte kernel's argument types, or the word kernel's (WORDS int32 for PACKED)."""
    if kernel == "bytes":
        return dict(SIGNATURE)
    names = {"PACKED": "WORDS", "stride_p": "stride_w"}
    return {names.get(n, n): ("*i32" if n == "PACKED" else t) for n, t in SIGNATURE.items()}


def disassemble(kernel: str, block_n: int, block_k: int, warps: int) -> str:
    """The kernel's SASS for sm_90 at these blocks and one row of x."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.w4a16 import _w4a16_kernel, _w4a16_words_kernel

    fn = _w4a16_kernel if kernel == "bytes" else _w4a16_words_kernel
    consts = {"BLOCK_T": 1, "BLOCK_N": block_n, "BLOCK_K": block_k}
    if kernel == "words":
        consts["ASM"] = True  # (as on a GPU)
    sig = kernel_signature(kernel)
    divisible = [("WORDS" if n == "PACKED" else "stride_w" if n == "stride_p" else n)
                 if kernel == "words" else n for n in DIVISIBLE]  # fmt: skip
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = ASTSource(fn=fn, signature=sig | dict.fromkeys(consts, "constexpr"),
                    constexprs=consts, attrs=attrs)  # fmt: skip
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([tool, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip


def loop_opcodes(sass: str) -> collections.Counter:
    """Opcodes (without modifiers) of the longest loop: from a label to the backward branch
    that returns to it."""
    ops: list[tuple[str, str]] = []
    labels: dict[str, int] = {}
    for line in sass.splitlines():
        label = re.match(r"\s*\.(L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ops)
            continue
        ins = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*);", line)
        if ins:
            ops.append((ins.group(1).split(".")[0], ins.group(2)))
    best = (0, len(ops) - 1)
    found = False
    for i, (op, args) in enumerate(ops):
        target = re.search(r"(L_x_\d+)", args) if op == "BRA" else None
        if target and labels.get(target.group(1), i) < i:
            start = labels[target.group(1)]
            if not found or i - start > best[1] - best[0]:
                best, found = (start, i), True
    return collections.Counter(op for op, _ in ops[best[0] : best[1] + 1])


def profile(kernel: str, block_n: int, block_k: int, warps: int) -> dict:
    """One kernel at one set of blocks: its loop's instructions a weight (a thread's share
    of BLOCK_N x BLOCK_K per iteration), by kind, and the issue and conversion bounds in
    SM clocks a weight-lane."""
    ops = loop_opcodes(disassemble(kernel, block_n, block_k, warps))
    weights = block_n * block_k / (32 * warps)
    total = sum(ops.values())
    conversions = sum(ops[c] for c in CONVERSIONS)
    issue = total / weights / ISSUE_LANES
    convert = conversions / weights / CONVERSION_LANES
    return {
        "kernel": kernel, "block_n": block_n, "block_k": block_k, "warps": warps,
        "instructions_per_weight": total / weights,
        "conversions_per_weight": conversions / weights,
        "shuffles_per_weight": ops["SHFL"] / weights,
        "fp32_per_weight": sum(ops[o] for o in ("FFMA", "FADD", "FMUL")) / weights,
        "issue_clocks_per_weight": issue, "conversion_clocks_per_weight": convert,
        "bound": "conversions" if convert > issue else "issue",
        "opcodes": dict(ops.most_common()),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # (Triton's default, said aloud)
    rows = [profile(kernel, *blocks) for blocks in BLOCKS for kernel in ("bytes", "words")]
    print("| kernel | BLOCK_N x BLOCK_K, warps | instructions a weight | conversions | "
          "shuffles | fp32 ops | bound (SM clocks a weight-lane) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        clocks = max(r["issue_clocks_per_weight"], r["conversion_clocks_per_weight"])
        print(f"| {r['kernel']} | {r['block_n']} x {r['block_k']}, {r['warps']} | "
              f"{r['instructions_per_weight']:.2f} | {r['conversions_per_weight']:.2f} | "
              f"{r['shuffles_per_weight']:.2f} | {r['fp32_per_weight']:.2f} | "
              f"{r['bound']}: {clocks:.4f} |")  # fmt: skip
    if args.json:
        import triton

        with open(args.json, "w") as f:
            json.dump({"triton": triton.__version__, "target": "sm_90", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
