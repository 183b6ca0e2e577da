"""Gated activations over a fused [gate | up] projection."""
from __future__ import annotations

from torch import nn

ACTIVATION_KERNELS = {"silu": "silu_and_mul", "gelu_pytorch_tanh": "gelu_tanh_and_mul",
                      "gelu_tanh": "gelu_tanh_and_mul"}


class GatedActivation(nn.Module):
    """[T, 2I] -> [T, I]: act(gate) * up."""

    def __init__(self, hidden_act: str, kernels):
        super().__init__()
        if hidden_act not in ACTIVATION_KERNELS:
            raise ValueError(f"unsupported activation {hidden_act!r}; supported: {', '.join(ACTIVATION_KERNELS)}")
        self.kernel_name = ACTIVATION_KERNELS[hidden_act]
        self._kernel = getattr(kernels, self.kernel_name)

    def forward(self, x):
        return self._kernel(x)
