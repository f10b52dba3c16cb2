"""bench.w4a16_sass: the W4A16 kernels' loops as compiled for sm_90 (in a child process with
the interpreter off, as tests/kernels/test_compile_sm90.py does). The word kernel's reason to
exist is checked here: no int-to-float conversion in its loop and fewer instructions a weight
than the byte kernel at the blocks the H200 chose for the 8B's linears."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.w4a16_sass import loop_opcodes
from kernels import HAS_TRITON

ROOT = Path(__file__).resolve().parents[2]

PROFILE = """
import json
from bench.w4a16_sass import profile
rows = [profile(kernel, *blocks) for blocks in ((32, 1024, 4), (64, 1024, 8))
        for kernel in ("bytes", "words")]
print(json.dumps(rows))
"""

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   I2FP.F32.U32 R2, R3 ;
        /*0020*/                   FFMA R4, R2, R5, R4 ;
        /*0030*/              @P0  BRA `(.L_x_0) ;
.L_x_1:
        /*0040*/                   LOP3.LUT R2, R3, 0xf, RZ, 0xc0, !PT ;
        /*0050*/                   FFMA R4, R2, R5, R4 ;
        /*0060*/                   FADD R4, R4, R6 ;
        /*0070*/                   SHFL.BFLY PT, R7, R4, 0x1, 0x1f ;
        /*0080*/              @!P1 BRA `(.L_x_1) ;
        /*0090*/                   EXIT ;
"""


def test_the_longest_loop_is_counted_without_modifiers():
    assert loop_opcodes(SASS) == {"LOP3": 1, "FFMA": 1, "FADD": 1, "SHFL": 1, "BRA": 1}


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_the_word_kernel_has_no_conversions_and_fewer_instructions_a_weight():
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-c", PROFILE], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=600)  # fmt: skip
    if run.returncode and "ptxas" in run.stderr.lower():
        pytest.skip("this Triton has no ptxas")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    for bytes_row, words_row in zip(rows[::2], rows[1::2], strict=True):
        assert bytes_row["conversions_per_weight"] == 1.0  # one I2F a weight
        assert words_row["conversions_per_weight"] == 0.0
        assert words_row["instructions_per_weight"] < 0.9 * bytes_row["instructions_per_weight"]
        assert words_row["bound"] == "issue" and bytes_row["bound"] == "conversions"
