"""Rotary position embedding (RoFormer, Su et al. 2021) and its context-extension variants.

Position p rotates the pair (x_i, x_{i+d/2}) of each head by the angle p * f_i, with
f_i = theta^(-2i/d): the "rotate half" pairing that HF-format checkpoints store their
q/k projections in. The variants only change the frequencies f (and, for YaRN, scale
cos and sin):

    linear   positional interpolation (Chen et al. 2023): f / factor
    dynamic  dynamic NTK: beyond the trained length L0 a sequence of length L uses
             theta * (factor * L / L0 - (factor - 1)) ^ (d / (d - 2))
    llama3   Llama 3.1: low frequencies / factor, high ones kept, a smooth blend between
    yarn     YaRN (Peng et al. 2023): per-frequency blend of interpolation and
             extrapolation by a linear ramp over rotation counts, cos/sin times mscale

The table (frequencies, angles, cos, sin) is computed in `table_dtype`: float32 by the
convention checkpoints are released with (Meta's reference code computes it so and
transformers does too), so that an fp64 run matches them; float64 for an exact table.
"""

from __future__ import annotations

import math

import torch


def default_freqs(theta, dim: int, dtype: torch.dtype) -> torch.Tensor:  # -> [dim/2]
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim))


def linear_freqs(rope: dict, dim: int, dtype: torch.dtype) -> torch.Tensor:  # -> [dim/2]
    return default_freqs(rope["rope_theta"], dim, dtype) / rope["factor"]


def dynamic_freqs(rope: dict, dim: int, length: int, trained: int, dtype: torch.dtype) -> torch.Tensor:
    """-> [dim/2]; a sequence within the trained length keeps the plain frequencies."""
    if length <= trained:
        return default_freqs(rope["rope_theta"], dim, dtype)
    factor = rope["factor"]
    stretch = (factor * torch.tensor(float(length), dtype=dtype) / trained - (factor - 1)) ** (dim / (dim - 2))
    return default_freqs(rope["rope_theta"] * stretch, dim, dtype)


def llama3_freqs(rope: dict, dim: int, dtype: torch.dtype) -> torch.Tensor:  # -> [dim/2]
    f = default_freqs(rope["rope_theta"], dim, dtype)
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    context = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / f
    smooth = (context / wavelen - low) / (high - low)  # 0 at the low band edge, 1 at the high one
    blended = (1 - smooth) * f / factor + smooth * f
    scaled = torch.where(wavelen > context / low, f / factor, blended)
    return torch.where(wavelen < context / high, f, scaled)


def yarn_freqs(rope: dict, dim: int, max_positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """-> ([dim/2] frequencies, attention factor that scales cos and sin)."""
    theta, context = rope["rope_theta"], rope["original_max_position_embeddings"]
    factor = rope.get("factor") or max_positions / context
    powers = theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim)
    low, high = yarn_band(rope, dim, theta, context)
    ramp = ((torch.arange(dim // 2, dtype=dtype) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp  # weight of the unscaled frequency: 1 for fast ones
    f = (1.0 / (factor * powers)) * (1 - extrapolate) + (1.0 / powers) * extrapolate
    return f, yarn_attention_factor(rope, factor)


def yarn_band(rope: dict, dim: int, theta: float, context: int) -> tuple[float, float]:
    """Dimension indices where the ramp starts and ends: the dims that turn beta_fast and
    beta_slow times over the trained context (rounded outwards unless truncate is false)."""

    def dim_turning(turns):
        return dim * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_turning(rope.get("beta_fast") or 32), dim_turning(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    return low, (high + 0.001 if low == high else high)


def yarn_attention_factor(rope: dict, factor: float) -> float:
    if rope.get("attention_factor") is not None:
        return rope["attention_factor"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.get("mscale") and rope.get("mscale_all_dim"):
        return float(mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"]))
    return mscale(factor)


def frequencies(rope: dict, dim: int, length: int, max_positions: int, dtype: torch.dtype):
    """Rope config -> ([dim/2] frequencies, cos/sin scale) for a sequence of `length` tokens."""
    kind = rope["rope_type"]
    if kind == "default":
        return default_freqs(rope["rope_theta"], dim, dtype), 1.0
    if kind == "linear":
        return linear_freqs(rope, dim, dtype), 1.0
    if kind == "dynamic":
        return dynamic_freqs(rope, dim, length, max_positions, dtype), 1.0
    if kind == "llama3":
        return llama3_freqs(rope, dim, dtype), 1.0
    if kind == "yarn":
        return yarn_freqs(rope, dim, max_positions, dtype)
    raise ValueError(f"refmodel does not implement rope_type {kind!r}; known: default, linear, dynamic, llama3, yarn")


def cos_sin(freqs: torch.Tensor, scale: float, positions: torch.Tensor, dtype: torch.dtype):
    """[dim/2] frequencies, [S] positions -> cos, sin [S, dim] in the run dtype."""
    angles = positions[:, None].to(freqs.dtype) * freqs  # [S, dim/2]
    both = torch.cat((angles, angles), dim=-1)  # pair i and i + dim/2 share an angle
    return (both.cos() * scale).to(dtype), (both.sin() * scale).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[H, S, D] rotated by cos, sin [S, D]: (a, b) -> (a cos - b sin, b cos + a sin)."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin
