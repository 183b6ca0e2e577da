"""Linear layers with weight loaders.

Fused projections (qkv_proj, gate_up_proj) hold several checkpoint tensors in
one weight; each checkpoint tensor is copied into its slice by the layer's
`weight_loader(param, loaded, shard_id)`. Tensor parallelism and quantized
weights plug in here (sharding in the loaders, `apply` for the matmul).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LinearBase(nn.Module):
    quant = None    # a QuantizedWeight once tinyserve.quantization has replaced `weight`

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        super().__init__()
        self.input_size = input_size
        self.output_sizes = list(output_sizes)   # slices of the output, in order (one unless fused)
        out = sum(self.output_sizes)
        self.weight = nn.Parameter(torch.empty(out, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = nn.Parameter(torch.empty(out), requires_grad=False) if bias else None
        if bias:
            self.bias.weight_loader = self.weight_loader

    def shard_offset(self, shard_id: int) -> tuple[int, int]:
        start = sum(self.output_sizes[:shard_id])
        return start, self.output_sizes[shard_id]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None = None) -> None:
        if shard_id is None:
            if param.shape != loaded.shape:
                raise ValueError(f"weight shape {tuple(loaded.shape)} != parameter {tuple(param.shape)}")
            param.data.copy_(loaded)
            return
        start, size = self.shard_offset(shard_id)
        target = param.data.narrow(0, start, size)
        if target.shape != loaded.shape:
            raise ValueError(f"shard {shard_id}: weight shape {tuple(loaded.shape)} != slice {tuple(target.shape)}")
        target.copy_(loaded)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            return self.quant(x, self.bias)
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(x)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, [output_size], bias)


class RowLinear(ReplicatedLinear):
    """Input-sharded under tensor parallelism (o_proj, down_proj); whole for now."""


class MergedColumnLinear(LinearBase):
    """Several column projections of the same input in one matmul (gate_up_proj)."""


class QKVLinear(LinearBase):
    """q, k and v projections fused; shard ids 0/1/2 (or 'q'/'k'/'v')."""
    SHARDS = {"q": 0, "k": 1, "v": 2}

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], bias)
        self.head_dim = head_dim

    def weight_loader(self, param, loaded, shard_id=None):
        super().weight_loader(param, loaded, self.SHARDS.get(shard_id, shard_id))
