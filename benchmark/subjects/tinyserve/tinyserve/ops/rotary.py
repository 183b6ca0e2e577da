"""Rotary position embedding kernels (neox / rotate-half layout, as in HF Llama).

cos_sin_cache: [max_positions, rot_dim] fp32, cos in the first half, sin in the
second; q/k: [T, heads * head_dim]. cos/sin are cast to the model dtype before
use, as transformers does.
"""
from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    # x [T, N*D]; cos/sin [T, D/2] -> [T, N*D]
    t = x.shape[0]
    x = x.view(t, -1, head_dim)
    half = head_dim // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    out = torch.empty_like(x)
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:] = x2 * cos + x1 * sin
    return out.view(t, -1)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).chunk(2, dim=-1)
    return _rotate(query, cos, sin, head_dim), _rotate(key, cos, sin, head_dim)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_embedding_native(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                            cos_sin_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    cos = torch.cat((cos, cos), dim=-1).to(query.dtype).unsqueeze(1)   # [T, 1, D]
    sin = torch.cat((sin, sin), dim=-1).to(query.dtype).unsqueeze(1)
    q = query.view(query.shape[0], -1, head_dim)
    k = key.view(key.shape[0], -1, head_dim)
    q_rot = q * cos + _rotate_half(q) * sin
    k_rot = k * cos + _rotate_half(k) * sin
    return q_rot.reshape(query.shape), k_rot.reshape(key.shape)
