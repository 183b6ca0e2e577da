"""RMSNorm kernels.

Both conventions follow their reference implementation bit for bit where the
dtype allows: Llama normalises in fp32, casts back, then multiplies by the
weight in the model dtype; Gemma (weight_offset=1, weight stored as w, applied
as 1+w) multiplies in fp32 and casts at the end.
"""
from __future__ import annotations

import torch


def _acc(dtype: torch.dtype) -> torch.dtype:
    # fp32 accumulation, or wider when the model itself runs wider
    return torch.promote_types(dtype, torch.float32)


def _scale_by_weight(normed: torch.Tensor, weight: torch.Tensor, weight_offset: float,
                     dtype: torch.dtype) -> torch.Tensor:
    if weight_offset:
        return (normed * (weight_offset + weight.to(normed.dtype))).to(dtype)
    return weight * normed.to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    # [T, H] -> [T, H]
    xf = x.to(_acc(x.dtype))
    inv_rms = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return _scale_by_weight(xf * inv_rms, weight, weight_offset, x.dtype)


def rms_norm_native(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    # [T, H] -> [T, H]
    xf = x.to(_acc(x.dtype))
    variance = (xf * xf).sum(-1, keepdim=True) / x.shape[-1]
    normed = xf / torch.sqrt(variance + eps)
    if weight_offset:
        return (normed * (weight.to(xf.dtype) + weight_offset)).to(x.dtype)
    return normed.to(x.dtype) * weight


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x; x = rms_norm(residual). In place on both buffers, like the CUDA kernel.

    [T, H], [T, H] -> (normed [T, H], new residual [T, H])
    """
    residual.add_(x)
    x.copy_(rms_norm(residual, weight, eps, weight_offset))
    return x, residual


def fused_add_rms_norm_native(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                              weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    new_residual = x + residual
    return rms_norm_native(new_residual, weight, eps, weight_offset), new_residual
