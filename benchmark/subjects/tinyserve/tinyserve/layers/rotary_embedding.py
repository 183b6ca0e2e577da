"""Rotary embedding: inverse frequencies per scaling type, cos/sin cache, the layer.

The frequency math follows transformers' ROPE_INIT_FUNCTIONS (same tensor ops, so
the same fp32 values); cos/sin are computed in fp32 and cast to the model dtype
only when applied.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _base_inv_freq(base, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def default_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):
    return _base_inv_freq(rope["rope_theta"], dim), 1.0


def linear_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):
    # scaling positions by 1/factor == scaling frequencies by 1/factor
    return _base_inv_freq(rope["rope_theta"], dim) / rope["factor"], 1.0


def dynamic_ntk_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):
    """NTK-aware: grow the base once the sequence outgrows max_position_embeddings."""
    factor = rope["factor"]
    seq_len = max_pos if seq_len is None else torch.maximum(torch.as_tensor(seq_len), torch.tensor(max_pos))
    base = rope["rope_theta"] * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return _base_inv_freq(base, dim), 1.0


def llama3_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):
    """Llama 3.1: keep high frequencies, divide low ones by factor, blend in between."""
    inv_freq = _base_inv_freq(rope["rope_theta"], dim)
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_range(rope: dict, dim: int, base: float) -> tuple[float, float]:
    """Dimension range over which YaRN ramps from extrapolation to interpolation."""
    old_len = rope["original_max_position_embeddings"]

    def dim_for(rotations):
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = dim_for(rope.get("beta_fast") or 32), dim_for(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):
    base, factor = rope["rope_theta"], rope.get("factor")
    if factor is None:
        factor = max_pos / rope["original_max_position_embeddings"]
    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
        attention_factor = (float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all))
                            if mscale and mscale_all else _yarn_mscale(factor))
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    low, high = _yarn_correction_range(rope, dim, base)
    if low == high:
        high += 0.001   # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, attention_factor


ROPE_SCALING = {"default": default_inv_freq, "linear": linear_inv_freq, "dynamic": dynamic_ntk_inv_freq,
                "llama3": llama3_inv_freq, "yarn": yarn_inv_freq}


def compute_cos_sin_cache(inv_freq: torch.Tensor, positions: torch.Tensor, attention_scaling: float) -> torch.Tensor:
    # positions [P] -> [P, dim] fp32: cos | sin
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    return torch.cat((freqs.cos() * attention_scaling, freqs.sin() * attention_scaling), dim=-1)


class RotaryEmbedding(nn.Module):
    """forward(positions [T], q [T, H*D], k [T, KVH*D]) -> rotated (q, k)."""

    def __init__(self, head_dim: int, max_position: int, max_model_len: int, rope: dict, kernels):
        super().__init__()
        rope_type = rope["rope_type"]
        if rope_type not in ROPE_SCALING:
            raise ValueError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(ROPE_SCALING)}")
        self.head_dim, self.rope, self.max_position = head_dim, rope, max_position
        self.is_dynamic = rope_type == "dynamic"
        inv_freq, self.attention_scaling = ROPE_SCALING[rope_type](rope, head_dim, max_position)
        n = max(max_position, max_model_len)
        # a plain attribute, not a buffer: it must stay fp32 when the model is cast
        self.cos_sin_cache = compute_cos_sin_cache(inv_freq, torch.arange(n), self.attention_scaling)
        self._kernel = kernels.rotary_embedding

    def cache_for(self, positions: torch.Tensor) -> torch.Tensor:
        """Dynamic NTK re-derives the frequencies once a forward reaches past max_position
        (as transformers does per forward); every other type uses the precomputed cache."""
        seq_len = int(positions.max()) + 1 if positions.numel() else 0
        if not self.is_dynamic or seq_len <= self.max_position:
            return self.cos_sin_cache
        inv_freq, scaling = dynamic_ntk_inv_freq(self.rope, self.head_dim, self.max_position,
                                                 torch.tensor(seq_len))
        return compute_cos_sin_cache(inv_freq, torch.arange(seq_len), scaling)

    def forward(self, positions, query, key):
        return self._kernel(positions, query, key, self.cache_for(positions), self.head_dim)
