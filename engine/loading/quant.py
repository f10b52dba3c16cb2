"""4-bit linear layers for CPU decode, from the Q4_0/Q4_1 arrays that
engine.loading.gguf_checkpoint keeps.

Decode on a small CPU is memory-bound: each token reads every weight once. torch's CPU
int4 kernel reads 4-bit weights (8x less than fp32) and computes in bf16. The 120 linears
of SmolLM2-135M (30 layers), 2 cores of a Sapphire Rapids, min of 4 runs, ms per forward:

    tokens T            1     4     8    12    16    32    48    64   512
    Int4Linear        6.8   9.9  15.7  21.7  27.4  48.2  69.6  89.9   690
    F.linear fp32    19.2  31.9  39.2  45.0  45.0  54.1  60.5  76.2   332
    F.linear bf16    20.6  21.2  22.1  22.0  22.1  24.6  29.6  32.8  93.1  (AMX)

The int4 kernel costs ~1.35 ms per token (no reuse of a weight across rows), so prefill
chunks (up to 512 tokens) run 2x slower than fp32 in it: Int4Linear can keep a dense weight
for inputs of more than max_tokens rows. End to end (Engine, 2048-token prefill, 512-token
chunks): fp32 model 2.9 s; int4 + dense fp32 2.9 s; int4 + dense bf16 1.9 s; int4 alone 4.4 s.
Decode of the whole model: 42 ms/token fp32, 25 ms/token int4.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import EngineError
from engine.loading.devices import cpu_has_amx
from engine.loading.gguf_quants import INT4_TYPES, INT8_TYPES, int8_rows

if TYPE_CHECKING:
    from engine.models.causal_lm import CausalLM

GROUP_SIZE = 32  # GGUF Q4 block: one scale and zero per 32 weights along K
_FUSED = {  # our fused module -> its HF parts, in loader.py's row order
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}


class QuantLinear(nn.Module):
    """y = x @ W.T + bias through a quantized CPU kernel on bf16 activations. With `dense`
    (W in fp32 or bf16), inputs of more than `max_tokens` rows use F.linear instead."""

    # dense dtype -> default max_tokens: above these many tokens the dense weight wins (the
    # tables above, with some margin)
    DENSE_ABOVE: dict[torch.dtype, int] = {}

    def __init__(
        self,
        N: int,
        K: int,
        bias: torch.Tensor | None,
        dense: torch.Tensor | None,
        max_tokens: int | None,
    ):
        super().__init__()
        if dense is not None and dense.shape != (N, K):
            raise ValueError(f"dense weight {tuple(dense.shape)} is not {(N, K)}")
        self.in_features, self.out_features = K, N
        self.bias: torch.Tensor | None
        self.register_buffer("bias", bias)
        self.dense: torch.Tensor | None
        self.register_buffer("dense", dense)
        if max_tokens is None:
            max_tokens = self.DENSE_ABOVE.get(dense.dtype, 32) if dense is not None else 0
        self.max_tokens = max_tokens

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        """x: bf16 [T, K], contiguous -> [T, out_features]"""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, kernel_rows: int = 0) -> torch.Tensor:
        """kernel_rows: use the quantized kernel up to this many rows even past max_tokens (a
        verification step's rows must match single-row decode bit for bit)."""
        # Kept lean: at T = 1 a kernel takes ~15 us, so each extra op's ~1 us shows.
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        dense, bias = self.dense, self.bias
        if dense is not None and x2.shape[0] > max(self.max_tokens, kernel_rows):
            y = F.linear(x2.to(dense.dtype), dense, None if bias is None else bias.to(dense.dtype))
        else:
            y = self._kernel(x2.to(torch.bfloat16).contiguous())
            if bias is not None:
                y = y + bias
        y = y.to(x.dtype)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        dense = "none" if self.dense is None else str(self.dense.dtype).removeprefix("torch.")
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, dense={dense} above {self.max_tokens} tokens"
        )


class Int4Linear(QuantLinear):
    """W[n, k] = q[n, k] * scale[n, k // 32] + zero[n, k // 32], q in 0..15: torch's CPU int4
    kernel (~1e-2 abs error on outputs of ~3: bf16 activations, scales and zeros)."""

    DENSE_ABOVE = {torch.float32: 32, torch.bfloat16: 8}

    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor,
        bias: torch.Tensor | None = None,
        dense: torch.Tensor | None = None,
        max_tokens: int | None = None,
    ):
        N, K = q.shape
        if K % GROUP_SIZE or scale.shape != (N, K // GROUP_SIZE) or zero.shape != scale.shape:
            raise ValueError(
                f"bad 4-bit weight: q {tuple(q.shape)}, scale {tuple(scale.shape)}, "
                f"zero {tuple(zero.shape)}; K must be a multiple of {GROUP_SIZE}"
            )
        super().__init__(N, K, bias, dense, max_tokens)
        # the kernel wants N % 16 == 0: pad with zero rows (scale 0, zero 0) and slice them off
        pad = -N % 16
        q, scale, zero = (F.pad(t, (0, 0, 0, pad)) for t in (q, scale.float(), zero.float()))
        self.packed: torch.Tensor
        self.register_buffer(
            "packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        )
        # The kernel computes (q - 8) * s + z: so s = scale, z = zero + 8 scale, as [K/32, N, 2].
        sz = torch.stack([scale, zero + 8 * scale], dim=-1).transpose(0, 1)
        self.scales_and_zeros: torch.Tensor
        self.register_buffer("scales_and_zeros", sz.to(torch.bfloat16).contiguous())

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, GROUP_SIZE, self.scales_and_zeros
        )
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]  # padding


class Int8Linear(QuantLinear):
    """W[n, k] = q[n, k] * scale[n], q int8 and scale a bfloat16 per row: torch's CPU int8
    kernel (bf16 activations and outputs). The output head, too, without bias or dense."""

    DENSE_ABOVE = {torch.float32: 32, torch.bfloat16: 8}

    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None = None,
        dense: torch.Tensor | None = None,
        max_tokens: int | None = None,
    ):
        N, K = q.shape
        # the AVX2 kernel steps K by 8
        if q.dtype != torch.int8 or scale.shape != (N,) or K % 8:
            raise ValueError(
                f"bad int8 weight: q {tuple(q.shape)} {q.dtype}, scale {tuple(scale.shape)}; "
                "K must be a multiple of 8"
            )
        super().__init__(N, K, bias, dense, max_tokens)
        # the kernel's AVX-512 build reads both 64-byte aligned (a safetensors view of the
        # rows may sit anywhere: it segfaulted at 4 bytes past a 64-byte line)
        self.q: torch.Tensor
        self.register_buffer("q", _aligned(q.contiguous()))
        self.scale: torch.Tensor
        self.register_buffer("scale", _aligned(scale.to(torch.bfloat16).contiguous()))

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        # a view into a bf16 buffer: the kernel would crash (it needs 16-byte aligned rows on
        # AVX2 and 64-byte aligned ones on AVX-512)
        return torch.ops.aten._weight_int8pack_mm(_aligned(x), self.q, self.scale)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t, or a copy of it starting on a 64-byte boundary (torch allocates CPU tensors so)."""
    return t.clone() if t.data_ptr() % 64 else t


QUANT_LINEARS = (Int4Linear, Int8Linear)


def load_quantized(
    model: CausalLM,
    directory: Path,
    dense_dtype: torch.dtype | None = torch.float32,
    all_int4: bool = False,
) -> int:
    """Replace every layer's qkv_proj, o_proj, gate_up_proj and down_proj with a quantized
    linear from directory's Q4_FILE and Q8_FILE (written by engine.loading.gguf_checkpoint):
    an Int4Linear where each of its HF parts has a 4-bit form, else an Int8Linear where each
    has one form or the other (a 4-bit part, such as a Q4_K q_proj beside a Q6_K v_proj, is
    requantized to int8 from its dense rows). Returns how many modules were replaced: 0,
    with the model unchanged, when some weight has no quantized form (an F16 GGUF, a plain
    checkpoint).

    dense_dtype: keep each weight also densely in this dtype (the loaded fp32 one, or a bf16
    copy) for prefill chunks, where the quantized kernels are slower; None frees it.
    all_int4: every module an Int4Linear, the parts without a 4-bit form requantized to
    4-bit groups (engine.loading.int4_groups): half the bytes of int8 rows, less precise.
    CPU only: ValueError for a model on another device."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"quantized weights run on CPU only; the model is on {device}")
    if dense_dtype not in (None, torch.float32, torch.bfloat16):
        raise ValueError(f"dense_dtype must be None, float32 or bfloat16, not {dense_dtype}")
    plan = []  # (parent module, attribute, current nn.Linear, HF names of its row blocks)
    for i, layer in enumerate(model.layers):
        for ours, hf_names in _FUSED.items():
            parent_name, _, attr = ours.partition(".")
            parent = getattr(layer, parent_name)
            bases = [f"model.layers.{i}.{hf}" for hf in hf_names]
            plan.append((parent, attr, getattr(parent, attr), bases))
    with _Arrays(directory) as arrays:
        # All or nothing (the promise above): check every form and shape before changing
        # anything.
        forms = [[arrays.form(b) for b in bases] for *_, bases in plan]
        if not plan or any(None in f for f in forms):
            return 0
        for (_, _, old, bases), kinds in zip(plan, forms, strict=True):
            shapes = [arrays.shape(kind, b) for kind, b in zip(kinds, bases, strict=True)]
            rows, cols = sum(s[0] for s in shapes), {s[1] for s in shapes}
            if (rows, *cols) != tuple(old.weight.shape):
                raise ValueError(
                    f"{directory}: {bases[0]}: quantized rows {rows} x {sorted(cols)} do not "
                    f"fit the model's {tuple(old.weight.shape)} weight"
                )
        for (parent, attr, old, bases), kinds in zip(plan, forms, strict=True):
            dense = None if dense_dtype is None else old.weight.detach().to(dense_dtype)
            bias = None if old.bias is None else old.bias.detach()
            if all_int4 or all(kind == "q4" for kind in kinds):
                # fused rows in loader.py's order: q, k, v and gate, up
                q, scale, zero = arrays.int4(bases, kinds, old.weight.detach())
                setattr(parent, attr, Int4Linear(q, scale, zero, bias, dense))
            else:
                q, scale = arrays.int8(bases, kinds, old.weight.detach())
                setattr(parent, attr, Int8Linear(q, scale, bias, dense))
    return len(plan)


class _Arrays:
    """The Q4_FILE and Q8_FILE of a converted checkpoint, open (either may be missing)."""

    def __init__(self, directory: Path):
        from engine.loading.gguf_checkpoint import Q4_FILE, Q8_FILE

        self.paths = {"q4": Path(directory) / Q4_FILE, "q8": Path(directory) / Q8_FILE}
        self.files: dict[str, Any] = {}

    def __enter__(self) -> _Arrays:
        from safetensors import safe_open

        for kind, path in self.paths.items():
            if path.is_file():
                self.files[kind] = safe_open(str(path), framework="pt", device="cpu")
        self.keys = {kind: set(f.keys()) for kind, f in self.files.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        self.files.clear()  # (safe_open handles close when collected)

    def form(self, base: str) -> str | None:
        """Which quantized form the HF weight `base` has: "q4", "q8" or None."""
        if {f"{base}.{p}" for p in ("q", "scale", "zero")} <= self.keys.get("q4", set()):
            return "q4"
        if {f"{base}.q", f"{base}.scale"} <= self.keys.get("q8", set()):
            return "q8"
        return None

    def shape(self, kind: str, base: str) -> list[int]:
        return list(self.files[kind].get_slice(f"{base}.q").get_shape())

    def get(self, kind: str, base: str, part: str) -> torch.Tensor:
        return self.files[kind].get_tensor(f"{base}.{part}")

    def int4(
        self, bases: list[str], kinds: list[str], dense: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fused module's 4-bit groups: stored ones, or requantized from the dense rows."""
        from engine.loading.int4_groups import int4_groups

        parts, row = [], 0
        for base, kind in zip(bases, kinds, strict=True):
            n = self.shape(kind, base)[0]
            if kind == "q4":
                parts.append(tuple(self.get("q4", base, p) for p in ("q", "scale", "zero")))
            else:
                parts.append(int4_groups(dense[row : row + n]))
            row += n
        q, scale, zero = (torch.cat([p[i] for p in parts]) for i in range(3))
        return q, scale, zero

    def int8(
        self, bases: list[str], kinds: list[str], dense: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused module's int8 rows: stored ones, or requantized from the dense rows."""
        qs, scales, row = [], [], 0
        for base, kind in zip(bases, kinds, strict=True):
            n = self.shape(kind, base)[0]
            if kind == "q8":
                q, scale = self.get("q8", base, "q"), self.get("q8", base, "scale")
            else:
                q, scale = map(torch.from_numpy, int8_rows(dense[row : row + n].float().numpy()))
            qs.append(q)
            scales.append(scale)
            row += n
        return torch.cat(qs), torch.cat(scales)


def quantize_lm_head(model: CausalLM, directory: Path | None = None) -> None:
    """Give a CPU model an int8 output head (decode speed); the dense head stays for reference.
    Its int8 rows come from directory's Q8_FILE where the converter stored them, else from
    the model's weight."""
    if model.embed_tokens.weight.device.type != "cpu":
        raise ValueError("the int8 head is a CPU kernel")
    tied = model.cfg.tie_word_embeddings
    weight = (model.embed_tokens if tied else model.lm_head).weight.detach()
    base = "model.embed_tokens" if tied else "lm_head"
    q = scale = None
    if directory is not None:
        with _Arrays(directory) as arrays:
            if arrays.form(base) == "q8" and arrays.shape("q8", base) == list(weight.shape):
                q, scale = arrays.get("q8", base, "q"), arrays.get("q8", base, "scale")
    if q is None:
        q, scale = map(torch.from_numpy, int8_rows(weight.float().numpy()))
    model.int8_head = Int8Linear(q, scale)


def load_int4(net, source, device: torch.device, required: bool, all_int4: bool = False) -> bool:
    """Switch a CPU model to the GGUF's quantized linears for decode (4-bit blocks, or int8
    rows for 5- to 8-bit types; with all_int4, 4-bit groups requantized from those) and an
    int8 output head: Engine.load's weights="int4", "int4-all" and "auto". Returns whether
    it did; `required` turns "no quantized weights here" into an error."""
    if device.type != "cpu":
        if required:
            raise EngineError("int4 weights run on the CPU only")
        return False
    # prefill chunks run dense: in bf16 where the CPU has AMX (3.5x faster than fp32 at 512
    # tokens on this machine's Xeon), else in the checkpoint's fp32
    dense = torch.bfloat16 if cpu_has_amx() else torch.float32
    if load_quantized(net, source.path, dense, all_int4) == 0:
        if required:
            types = ", ".join(INT4_TYPES + INT8_TYPES)
            raise EngineError(
                f"{source.name} has no quantized weights (int4 needs a GGUF whose linear "
                f"weights are all {types})"
            )
        return False
    quantize_lm_head(net, source.path)
    return True
