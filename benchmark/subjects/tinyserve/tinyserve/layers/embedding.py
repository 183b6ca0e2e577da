"""Token embedding, LM head and the logits processor."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    """ids [T] -> [T, H], times `scale` (Gemma: sqrt(hidden), cast to the weight dtype first)."""

    def __init__(self, vocab_size: int, hidden_size: int, scale: float | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.scale = scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(input_ids, self.weight)
        if self.scale is not None:
            x = x * torch.tensor(self.scale, dtype=x.dtype)
        return x


class LMHead(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)


class LogitsProcessor(nn.Module):
    """hidden [S, H] -> logits [S, V] in the model dtype, with Gemma's final soft-capping."""

    def __init__(self, vocab_size: int, soft_cap: float | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        self.soft_cap = soft_cap

    def forward(self, lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, lm_head.weight)
        if self.soft_cap:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        return logits[:, :self.vocab_size]
