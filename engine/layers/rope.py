"""Rotary position embeddings: default, linear, dynamic NTK, YaRN and Llama 3 scaling.

The frequency formulas follow the published methods (and transformers' rope utils, so that
logits match it): frequencies and angles are computed in float32, then cast to the model dtype.
"""

from __future__ import annotations

import math

import torch

from engine.config import ModelConfig


def base_inv_freq(theta: float, dim: int, device=None) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float)
    return 1.0 / (theta ** (exponents / dim))


def inv_freq_and_scale(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim/2] and the cos/sin scale for this config."""
    dim, theta, s = cfg.head_dim, cfg.rope_theta, cfg.rope_scaling or {}
    kind = cfg.rope_type
    if kind in ("default", "dynamic"):
        # dynamic NTK grows the base only past max_position_embeddings, which is where the
        # engine's window for it ends (ModelConfig.window_note says why)
        return base_inv_freq(theta, dim), 1.0
    if kind == "linear":
        return base_inv_freq(theta, dim) / s["factor"], 1.0
    if kind == "llama3":
        return _llama3_inv_freq(base_inv_freq(theta, dim), s), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(cfg, s)
    raise ValueError(kind)


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are interpolated, short ones kept, the band between is blended
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(cfg: ModelConfig, s: dict) -> tuple[torch.Tensor, float]:
    dim, base = cfg.head_dim, cfg.rope_theta
    orig = s["original_max_position_embeddings"]
    factor = s.get("factor") or cfg.max_position_embeddings / orig

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = s.get("attention_factor")
    if attn is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attn = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolation
    return inv_freq, attn


class RotaryEmbedding:
    """A cos/sin table for positions [0, max_len). Each position's angles are fixed, so keys
    cached by earlier chunks, reused prefixes or sessions are rotated as a single pass over
    the whole sequence would rotate them (dynamic NTK too: see inv_freq_and_scale)."""

    dynamic = False  # (no per-step angles: the runner passes no sequence lengths)

    def __init__(self, cfg: ModelConfig, max_len: int, device: torch.device, dtype: torch.dtype):
        self.cfg, self.device, self.dtype = cfg, device, dtype
        inv_freq, self.scale = inv_freq_and_scale(cfg)
        self.cos, self.sin = self._angles(torch.arange(max_len), inv_freq)

    def _angles(self, positions: torch.Tensor, inv_freq: torch.Tensor):
        freqs = positions.to(self.device, torch.float32)[:, None] * inv_freq.to(self.device)[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scale).to(self.dtype), (emb.sin() * self.scale).to(self.dtype)

    def __call__(self, positions: torch.Tensor, seq_lens: list[int] | None = None):
        """cos, sin: [T, D] (seq_lens is unused: the angles do not depend on them)."""
        return self.cos[positions], self.sin[positions]
