"""Gated MLP activations: act(gate) * up over a fused [gate | up] projection."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]; writes silu(gate) into a fresh buffer then multiplies in place
    d = x.shape[-1] // 2
    out = F.silu(x[..., :d])
    return out.mul_(x[..., d:])


def silu_and_mul_native(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    gate, up = x.chunk(2, dim=-1)
    g = gate.to(torch.promote_types(x.dtype, torch.float32))
    return (g / (1.0 + torch.exp(-g))).to(x.dtype) * up


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    d = x.shape[-1] // 2
    out = F.gelu(x[..., :d], approximate="tanh")
    return out.mul_(x[..., d:])


def gelu_tanh_and_mul_native(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]; 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    gate, up = x.chunk(2, dim=-1)
    g = gate.to(torch.promote_types(x.dtype, torch.float32))
    inner = math.sqrt(2.0 / math.pi) * (g + 0.044715 * g.pow(3))
    return (0.5 * g * (1.0 + torch.tanh(inner))).to(x.dtype) * up
