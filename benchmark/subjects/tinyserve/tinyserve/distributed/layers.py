"""Layers whose forward needs a collective under tensor parallelism.

They keep the state of the layer they replace (the loader swaps the class of an
already built module), so the model code itself stays unaware of ranks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tinyserve.distributed.parallel_state import all_gather_last_dim, all_reduce
from tinyserve.layers.embedding import LogitsProcessor, VocabEmbedding
from tinyserve.layers.linear import RowLinear


class RowParallelLinear(RowLinear):
    """Input features sharded (o_proj, down_proj): partial products summed over ranks.
    Only rank 0 holds the bias, so it is added once."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(self.apply(x))


class VocabParallelEmbedding(VocabEmbedding):
    """Rows [vocab_start, vocab_end) of the table on this rank; ids outside give zeros, then sum."""
    vocab_start = vocab_end = 0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local = torch.where(outside, torch.zeros_like(input_ids), input_ids - self.vocab_start)
        x = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        x = all_reduce(x)
        if self.scale is not None:
            x = x * torch.tensor(self.scale, dtype=x.dtype)
        return x


class VocabParallelLogitsProcessor(LogitsProcessor):
    """Each rank scores its vocabulary slice; the slices are gathered in rank order."""

    def forward(self, lm_head, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, lm_head.weight)
        if self.soft_cap:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        return all_gather_last_dim(logits)[:, :self.vocab_size]
