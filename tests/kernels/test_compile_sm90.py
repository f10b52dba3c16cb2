"""The Triton kernels that the interpreter runs on the CPU also compile for the H200
(sm_90) here, without a GPU: the interpreter accepts code that the compiler rejects (a
constexpr reassigned in a static loop once reached the GPU that way), and the lent GPU's
time is short. Compiling gives the PTX, which is checked for register spills too. (In a
child process: this suite runs the kernels in the interpreter, whose functions do not
compile.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
ROOT = Path(__file__).resolve().parents[2]

COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.page_recall import _recall_kernel
from kernels.page_topk import _select_hist_kernel, _select_probe_kernel
from kernels.page_topk_split import _split_count_kernel, _split_hist_kernel, _split_write_kernel
from kernels.uva_gather import NOT_STAGED, _gather_kernel, _stage_kernel

def build(fn, sig, consts, warps):
    sig = dict(sig) | {name: "constexpr" for name in consts}
    try:
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    except RuntimeError as e:
        if "ptxas" in str(e).lower():
            return "no ptxas"
        raise
    return "spills" if ".local" in k.asm["ptx"] else "ok"

out = {}
select_sig = {"S": "*fp32", "LENS": "*i32", "BUDGETS": "*i32", "OUT": "*i32", "CNT": "*i32",
              "budget": "i32", "s_sb": "i32", "s_sh": "i32", "s_ob": "i32", "s_oh": "i32"}
for bits, block, tail in ((2, 4096, 0), (2, 8192, 16), (2, 16384, 16384)):  # (probe2)
    consts = {"HKV": 8, "P": 16, "SINKS": 1, "WINDOW": 2, "WIDTH": 164, "WIDTH_P2": 256,
              "BLOCK": block, "TAIL": tail, "HAS_BUDGETS": True, "BITS": bits}
    out[f"probe{bits}/{block}+{tail}"] = build(_select_probe_kernel, select_sig, consts,
                                                min(32, block // 512))
for block, tail in ((8192, 16), (16384, 16384), (32768, 0)):
    consts = {"HKV": 8, "P": 16, "SINKS": 1, "WINDOW": 2, "WIDTH": 164, "WIDTH_P2": 256,
              "BLOCK": block, "TAIL": tail, "HAS_BUDGETS": True}
    out[f"hist/{block}+{tail}"] = build(_select_hist_kernel, select_sig, consts,
                                        min(32, block // 512))
split = {"HKV": 8, "P": 16, "SINKS": 1, "WINDOW": 2, "CHUNK": 1024, "HAS_BUDGETS": True}
base = {"S": "*fp32", "LENS": "*i32", "BUDGETS": "*i32", "HIST": "*i32"}
strides = {"s_sb": "i32", "s_sh": "i32"}
for r in (0, 3):
    out[f"split/hist{r}"] = build(_split_hist_kernel, base | {"budget": "i32"} | strides,
                                  split | {"ROUND": r}, 4)
out["split/count"] = build(_split_count_kernel, base | {"COUNTS": "*i32", "budget": "i32"}
                           | strides, split, 4)
out["split/write"] = build(_split_write_kernel, base | {"COUNTS": "*i32", "OUT": "*i32",
                           "CNT": "*i32", "budget": "i32"} | strides
                           | {"s_ob": "i32", "s_oh": "i32"},
                           split | {"NP": 32, "WIDTH": 625, "WIDTH_P2": 1024}, 4)
recall_sig = {"EXACT": "*i64", "VALID": "*u8", "PRED": "*i64", "PRED_COUNTS": "*i32",
              "MARK": "*i8", "ACC": "*i64", "BY_LAYER": "*i64", "W1": "i32", "W2": "i32",
              "n_pages": "i32", "c_hits": "i32", "c_total": "i32", "layer": "i32"}
out["recall"] = build(_recall_kernel, recall_sig, {"CHUNK": 256}, 4)
gather_sig = {"SRC": "*bf16", "DST": "*bf16", "SRC_IDX": "*i32", "DST_IDX": "*i32",
              "STAGE": "*bf16", "STAGE_OF": "*i32", "COUNT": "*i64", "n": "i32"}
for stage in (False, True):
    for rows in (1, 4, 8):
        consts = {"E": 4096, "EB": 4096, "ROWS": rows, "NPROG": 16, "HAS_STAGE": stage,
                  "NONE": NOT_STAGED, "HAS_COUNT": rows == 4}
        out[f"gather/rows={rows}/stage={stage}"] = build(_gather_kernel, gather_sig, consts, 8)
stage_sig = {"SRC": "*bf16", "STAGE": "*bf16", "PAGES": "*i32", "COUNTS": "*i32",
             "TABLES": "*i32", "LENS": "*i32", "SLOT_OF": "*i32", "STAGE_OF": "*i32",
             "AT": "*i64", "IDS": "*i32", "ACC": "*i64", "n": "i32", "M": "i32", "rows_written": "i32",
             "scratch_unit": "i32", "C_FETCHED": "i32", "C_PREFETCHED": "i32", "C_WASTE": "i32"}
consts = {"HKV": 8, "W": 164, "P": 16, "E": 4096, "EB": 4096, "ROWS": 4,
          "NPROG": 16, "NONE": NOT_STAGED}
out["stage"] = build(_stage_kernel, stage_sig, consts, 8)
from kernels import tier_alloc as ta
from kernels import tier_victims as tv
i64, i32 = "*i64", "*i32"
for name, sig in (
    ("_value_kernel", {"LAST": i64, "USES": i64, "CLOCK": i64, "VALUE": i32, "S": "i32",
                       "SCRATCH": "i32"}),
    ("_resolve_kernel", {"UNITS": i64, "VALID": "*i1", "SLOT_OF": i32, "CLAIM": i64,
                         "VALUE": i32, "LAST": i64, "CLOCK": i64, "U_OUT": i64,
                         "SLOT_OUT": i64, "ACC": i64, "n": "i32", "SCRATCH_UNIT": "i32",
                         "C_HITS": "i32", "C_TOTAL": "i32"}),
    ("_owner_kernel", {"U_IN": i64, "SLOT_IN": i64, "CLAIM": i64, "OWNER": i64, "n": "i32"}),
    ("_victims_hist_kernel", {"VALUE": i32, "RANK": i64, "HIST": i32, "S1": "i32", "n": "i32"}),
    ("_victims_count_kernel", {"VALUE": i32, "RANK": i64, "HIST": i32, "COUNTS": i32,
                               "S1": "i32", "n": "i32"}),
    ("_victims_write_kernel", {"VALUE": i32, "RANK": i64, "HIST": i32, "COUNTS": i32,
                               "VICTIMS": i64, "S1": "i32", "n": "i32"}),
    ("_assign_kernel", {"U_IN": i64, "RANK": i64, "VICTIMS": i64, "SLOT_OF": i32,
                        "UNIT_IN": i64, "USES": i64, "SRC": i32, "DST": i32, "ACC": i64,
                        "n": "i32", "C_FETCHED": "i32", "C_EVICTED": "i32", "C_DEMAND": "i32"}),
    ("_finish_kernel", {"U_IN": i64, "SLOT_OF": i32, "LAST": i64, "USES": i64, "CLOCK": i64,
                        "CLAIM": i64, "OUT": i32, "n": "i32", "SCRATCH_SLOT": "i32"}),
):
    consts = {"BLOCK": 1024}
    if name.startswith("_victims"):  # rounds 1-3 take the masked histogram (round 0 too)
        consts = {"CHUNK": tv.VICTIMS_CHUNK} | ({"ROUND": 3} if "hist" in name else {})
    if name == "_victims_write_kernel":
        consts |= {"NP": 32}
    if name == "_value_kernel":
        consts |= {"USES_BITS": 20, "RECENCY": ta.RECENCY_STEPS}
    warps = 4
    mod = tv if name.startswith("_victims") else ta
    if name == "_resolve_kernel":
        consts |= {"MARK_CLOCK": False}
    out[f"tier_alloc.{name}"] = build(getattr(mod, name), sig, consts, warps)
from kernels.page_union import _union_compact_kernel, _union_mark_kernel
from bench.synthetic_select import _synthetic_query_kernel
out["union/mark"] = build(_union_mark_kernel, {"PAGES": i32, "COUNTS": i32, "BITS": i32,
                          "K": "i32", "M": "i32", "T": "i32"}, {"HKV": 8, "BLOCK": 256}, 4)
out["union/compact"] = build(_union_compact_kernel, {"BITS": i32, "OUT": i32, "QMASK": i32,
                             "CNT": i32, "OVERFLOW": i32, "M": "i32", "W": "i32"},
                             {"CH": 4096}, 8)
out["synthetic_query"] = build(_synthetic_query_kernel, {"FIRST": "*fp32", "SEEN": "*u8",
                               "N_SEEN": i32, "BUDGETS": i32, "OUT": "*fp32", "CLOCK": i64, "salt": "i32",
                               "M": "i32", "recurring": "fp32", "s_sb": "i32", "s_sh": "i32",
                               "T": "i32"}, {"HKV": 8, "RECURRING": True, "DROP_P": 0.15, "BLOCK": 1024}, 4)
from kernels.w4a16 import _w4a16_kernel, _w4a16_words_kernel
w4_sig = {"X": "*bf16", "PACKED": "*u8", "SCALE": "*bf16", "ZERO": "*bf16", "OUT": "*fp32",
          "T": "i32", "N": "i32", "K": "i32", "K_SHARE": "i32", "stride_x": "i32",
          "stride_p": "i32", "stride_s": "i32", "stride_os": "i32", "stride_ot": "i32"}
# (the kernel's timed candidates: the one-row step, and a verification's rows, at each end)
for t, n, k, warps in ((1, 16, 128, 4), (1, 64, 256, 8), (16, 16, 128, 4), (16, 32, 128, 4),
                       (16, 64, 256, 8)):
    out[f"w4a16/{t}x{n}x{k}/{warps}"] = build(_w4a16_kernel, w4_sig,
                                             {"BLOCK_T": t, "BLOCK_N": n, "BLOCK_K": k}, warps)
words_sig = {("WORDS" if n == "PACKED" else "stride_w" if n == "stride_p" else n):
             ("*i32" if n == "PACKED" else ty) for n, ty in w4_sig.items()}
for t, n, k, warps in ((1, 16, 1024, 4), (1, 64, 1024, 8), (16, 16, 128, 4), (16, 64, 256, 8)):
    out[f"w4a16 words/{t}x{n}x{k}/{warps}"] = build(_w4a16_words_kernel, words_sig,
                                                   {"BLOCK_T": t, "BLOCK_N": n, "BLOCK_K": k,
                                                    "ASM": True}, warps)
from kernels.step_units import _units_kernel
out["step_units"] = build(_units_kernel, {"BT": i32, "PAGES": i32, "COUNTS": i32, "UNITS": i64,
                          "VALID": "*i8", "ACC": i64, "s_bt": "i32", "W": "i32", "M": "i32",
                          "ROWS": "i32", "C_SEL": "i32", "C_MAX": "i32", "C_STEPS": "i32"},
                          {"HKV": 8, "BLOCK_W": 256, "ROWS_P2": 64, "COUNT": True}, 4)
from kernels.tier_clock import RING_BLOCK, _clock_kernel
out["tier_clock"] = build(_clock_kernel, {"U_IN": i64, "SLOT_IN": i64, "CLAIM": i64,
                          "RANK": i32, "MARKS": i32, "USES": i64, "UNIT_IN": i64,
                          "SLOT_OF": i32, "HAND": i64, "CLOCK": i64, "VICTIMS": i64,
                          "SRC": i32, "DST": i32, "COUNT": i64, "ACC": i64, "n": "i32",
                          "S": "i32", "C_FETCHED": "i32", "C_EVICTED": "i32",
                          "C_DEMAND": "i32"}, {"BLOCK": 1024, "SBLOCK": RING_BLOCK}, 8)
out["tier_alloc._resolve_kernel/clock"] = build(ta._resolve_kernel, {"UNITS": i64,
    "VALID": "*i1", "SLOT_OF": i32, "CLAIM": i64, "VALUE": i32, "LAST": i64, "CLOCK": i64,
    "U_OUT": i64, "SLOT_OUT": i64, "ACC": i64, "n": "i32", "SCRATCH_UNIT": "i32",
    "C_HITS": "i32", "C_TOTAL": "i32"}, {"BLOCK": 1024, "MARK_CLOCK": True}, 4)
from kernels.rope_kv import _rope_kv_kernel
rope_sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "COS": "*bf16", "SIN": "*bf16",
            "PAGES": i32, "OFFS": i32, "KV": "*u8", "QOUT": "*bf16", "KOUT": "*bf16"}
rope_sig |= {n: "i32" for n in ("s_qt", "s_qh", "s_kt", "s_kh", "s_vt", "s_vh", "s_ct", "s_ot",
                                "s_oh", "s_kot", "s_koh", "s_kvp", "s_kvh", "s_kvkv", "s_kvt")}
out["rope_kv/fp8"] = build(_rope_kv_kernel, rope_sig, {"HQ": 32, "D": 128, "FP8": True}, 4)
from kernels.kv_append import _tier_append_kernel
append_sig = {"K": "*bf16", "V": "*bf16", "SLOTS": "*u8", "SLOT_OF": i32, "SUMM": "*bf16",
              "PAGES": i32, "OFFS": i32}
append_sig |= {n: "i32" for n in ("s_kn", "s_kh", "s_vn", "s_vh", "s_sn", "s_skv", "s_st",
                                  "s_un", "s_ur")}
append_consts = {"HKV": 8, "D": 128, "FOLD": True, "ROW_MIN": 0, "ROW_MAX": 1, "ROW_SUM": -1,
                 "FP8": True}
out["tier_append/fp8"] = build(_tier_append_kernel, append_sig, append_consts
                               | {"SUMM_FP8": False}, 4)
out["tier_append/fp8 summaries"] = build(_tier_append_kernel, append_sig | {"SUMM": "*u8"},
                                         append_consts | {"SUMM_FP8": True}, 4)
from kernels.page_score import _page_score_kernel
score_sig = {"Q": "*bf16", "SUMM": "*fp8e4nv", "BT": i32, "LENS": i32, "OUT": "*fp32"}
score_sig |= {n: "i32" for n in ("s_qb", "s_qt", "s_qh", "s_sn", "s_sr", "s_btb", "s_ob",
                                 "s_ot", "s_oh")}
for summ in ("*fp8e4nv", "*bf16"):
    out[f"page_score/{summ}"] = build(_page_score_kernel, score_sig | {"SUMM": summ}, {"HKV": 8,
                                      "G": 4, "T": 1, "R": 16, "D": 128, "P": 16, "BLOCK": 64,
                                      "MODE": 0, "IEEE": False, "ROW_MIN": 0, "ROW_MAX": 1,
                                      "ROW_SUM": -1, "PER_QUERY": False}, 4)
from kernels.sparse_decode import _sparse_decode_kernel
sd_sig = {"Q": "*bf16", "KV": "*fp8e4nv", "UNITS": i32, "PAGES": i32, "COUNTS": i32,
          "LENS": i32, "QMASK": i32, "ACC": "*fp32", "M": "*fp32", "L": "*fp32", "scale": "fp32"}
sd_sig |= {n: "i32" for n in ("s_qb", "s_qt", "s_qh", "s_kvn", "s_kvkv", "s_kvt", "s_ub",
                              "s_uh", "s_cb", "s_ab", "s_ah", "s_as", "s_ar", "s_mb", "s_mh",
                              "s_ms")}
for kv in ("*fp8e4nv", "*bf16"):
    out[f"sparse_decode/{kv}"] = build(_sparse_decode_kernel, sd_sig | {"KV": kv}, {"HKV": 8,
                                       "G": 4, "T": 1, "R": 16, "D": 128, "P": 16,
                                       "BLOCK_PAGES": 4, "NUM_SPLITS": 8, "IEEE": False,
                                       "HAS_QMASK": False}, 4)
from bench.synthetic_draw import _synthetic_draw_kernel, _synthetic_stamp_kernel
out["synthetic_draw"] = build(_synthetic_draw_kernel, {"STAMP": i32, "OUT": "*fp32",
                              "CLOCK": i64, "salt": "i32", "M": "i32", "keep": "fp32",
                              "s_sb": "i32", "s_sh": "i32"}, {"HKV": 8, "BLOCK": 1024}, 4)
out["synthetic_stamp"] = build(_synthetic_stamp_kernel, {"PAGES": i32, "VALID": "*u8",
                               "STAMP": i32, "CLOCK": i64, "W": "i32", "s_pb": "i32",
                               "s_ph": "i32", "s_vb": "i32", "s_vh": "i32", "s_sb": "i32",
                               "s_sh": "i32"}, {"HKV": 8, "BLOCK": 256}, 4)
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90_without_spills():
    env = dict(os.environ, TRITON_INTERPRET="0")
    run = subprocess.run([sys.executable, "-c", COMPILE], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    if set(results.values()) == {"no ptxas"}:
        pytest.skip("this Triton has no ptxas")
    assert results == dict.fromkeys(results, "ok"), results
