"""A float weight -> 4-bit groups of 32 (q in 0..15, a scale and a zero per group), the form
torch's CPU int4 kernel takes: the `--weights int4-all` mode's requantization of the 5- to
8-bit GGUF types (Q5_0, Q6_K, Q8_0...), which otherwise decode as int8 rows.

Decode on a small CPU reads every weight once per token, so bytes are time: int8 rows read 8
bits a weight, these groups 4 (plus 32 bits of bf16 scale and zero per 32 weights, 5 in
all). The price is precision: 16 levels per group where Q5_0 has 32.

Each group gets the least-squares fit over a few candidate grids (as llama.cpp's
make_qkx2_quants does): for steps around (max - min) / 15, the weights are rounded onto the
grid starting at min, then the scale and zero that minimise the squared error for that
rounding are solved in closed form; the candidate with the least error is kept. A group
already on a 16-level grid (a dequantized Q4_0 or Q4_1 block) is found exactly.
"""

from __future__ import annotations

import torch

GROUP = 32
LEVELS = 15  # q in 0..LEVELS
# candidate steps: (max - min) / (LEVELS + d) for these d
_STEP_OFFSETS = (0.0, -0.5, 0.5, 1.0, 1.5, 2.0, -1.0)
_ROWS_PER_CHUNK = 256  # rows per pass: bounded temporaries


def int4_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] (K a multiple of 32) -> (q uint8 [N, K] in 0..15, scale float32
    [N, K // 32], zero float32 [N, K // 32]) with weight ~ q * scale + zero per group."""
    if weight.dim() != 2 or weight.shape[1] % GROUP:
        raise ValueError(f"int4 groups need a [N, K] weight with K a multiple of {GROUP}, "
                         f"not {tuple(weight.shape)}")  # fmt: skip
    n, k = weight.shape
    dev = weight.device  # (a GPU's weights are fitted there)
    q = torch.empty(n, k, dtype=torch.uint8, device=dev)
    scale = torch.empty(n, k // GROUP, device=dev)
    zero = torch.empty(n, k // GROUP, device=dev)
    for i in range(0, n, _ROWS_PER_CHUNK):
        rows = weight[i : i + _ROWS_PER_CHUNK].float().reshape(-1, k // GROUP, GROUP)
        gq, gs, gz = _fit(rows)
        q[i : i + len(rows)] = gq.reshape(len(rows), k)
        scale[i : i + len(rows)], zero[i : i + len(rows)] = gs, gz
    return q, scale, zero


def _fit(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [..., 32] -> the best (q, scale, zero) of the candidate grids, per group."""
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    span = hi - lo
    flat = span == 0  # a constant group: q = 0, zero = its value
    safe = torch.where(flat, torch.ones_like(span), span)
    best_err = best_q = best_s = best_z = None
    for d in _STEP_OFFSETS:
        q = torch.round((w - lo) * ((LEVELS + d) / safe)).clamp_(0, LEVELS)
        s, z = _least_squares(q, w)
        err = (q * s + z - w).square_().sum(-1, keepdim=True)
        if best_err is None:
            best_err, best_q, best_s, best_z = err, q, s, z
            continue
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_q = torch.where(better, q, best_q)
        best_s = torch.where(better, s, best_s)
        best_z = torch.where(better, z, best_z)
    best_s = torch.where(flat, torch.zeros_like(best_s), best_s)
    best_z = torch.where(flat, lo, best_z)
    best_q = torch.where(flat, torch.zeros_like(best_q), best_q)
    return best_q.to(torch.uint8), best_s.squeeze(-1), best_z.squeeze(-1)


def _least_squares(q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The scale and zero minimising sum (q * s + z - w)^2 over each group (q fixed)."""
    qm, wm = q.mean(-1, keepdim=True), w.mean(-1, keepdim=True)
    dq = q - qm
    var = dq.square().sum(-1, keepdim=True)
    s = (dq * (w - wm)).sum(-1, keepdim=True) / var.clamp_min(1e-30)
    s = torch.where(var > 0, s, torch.zeros_like(s))
    return s, wm - s * qm
