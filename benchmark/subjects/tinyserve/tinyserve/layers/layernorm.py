"""RMSNorm layers (Llama style and Gemma's (1 + w) style)."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """forward(x) -> normed; forward(x, residual) -> (normed, residual + x), fused."""
    weight_offset = 0.0

    def __init__(self, hidden_size: int, eps: float, kernels):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps
        self._rms_norm = kernels.rms_norm
        self._fused_add_rms_norm = kernels.fused_add_rms_norm

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self._rms_norm(x, self.weight, self.eps, self.weight_offset)
        return self._fused_add_rms_norm(x, residual, self.weight, self.eps, self.weight_offset)


class GemmaRMSNorm(RMSNorm):
    """Checkpoint stores w; the scale applied is (1 + w), in fp32."""
    weight_offset = 1.0

    def __init__(self, hidden_size: int, eps: float, kernels):
        super().__init__(hidden_size, eps, kernels)
        self.weight.data.zero_()
