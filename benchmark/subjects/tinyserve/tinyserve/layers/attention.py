"""Attention layer over the paged KV cache.

Each layer owns its slice of the cache (`k_cache`, `v_cache`: [num_blocks,
block_size, KVH, D]), bound by the model runner. forward writes this step's
keys/values into their slots, then attends over everything cached.
"""
from __future__ import annotations

import torch
from torch import nn

from tinyserve.forward_context import get_forward_context
from tinyserve.ops.attention import write_to_kv_cache


class Attention(nn.Module):
    """q [T, H*D], k/v [T, KVH*D] (rotated) -> [T, H*D]."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, kernels,
                 sliding_window: int | None = None, softcap: float | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.sliding_window, self.softcap = scale, sliding_window, softcap
        self.k_cache = self.v_cache = torch.empty(0)
        self._kernel = kernels.paged_attention

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = get_forward_context().attn_metadata
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        write_to_kv_cache(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        out = self._kernel(q, self.k_cache, self.v_cache, meta.query_start_loc, meta.seq_lens,
                           meta.block_tables, self.scale, self.sliding_window, self.softcap)
        return out.reshape(t, self.num_heads * self.head_dim)
