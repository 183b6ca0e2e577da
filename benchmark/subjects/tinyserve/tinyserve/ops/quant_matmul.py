"""Weight-only quantized matmul: x [T, I] times a packed weight [O, I] -> [T, O].

Weight formats (see tinyserve.quantization):
  int8: qweight int8 [O, I], scale [O] (per output channel, symmetric), zero None, group_size 0
  int4: qweight uint8 [O, I/2] (even column in the low nibble), scale / zero [O, I/g] per group

The optimized path never materialises the float weight: it multiplies by the raw
integers and applies scales (and zero points) to the partial sums. The native
twin dequantizes to a float weight first, exactly as the checkpoint a reference
would load, then runs a plain matmul.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    # [O, I/2] uint8 -> [O, I] uint8 in 0..15, columns back in order
    return torch.stack([qweight & 0x0F, qweight >> 4], dim=-1).flatten(-2)


def dequantize_weight(qweight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                      group_size: int) -> torch.Tensor:
    """-> float32 weight [O, I]."""
    if zero is None:
        return qweight.float() * scale[:, None]
    q = unpack_int4(qweight).float().unflatten(-1, (-1, group_size))        # [O, G, g]
    return ((q - zero.float()[..., None]) * scale[..., None]).flatten(-2)


def _int4_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                 group_size: int) -> torch.Tensor:
    # sum_k x_k (q_k - z) s = s * (x . q - z * sum_k x_k), per group
    xg = x.unflatten(-1, (-1, group_size))                                    # [T, G, g]
    qg = unpack_int4(qweight).to(x.dtype).unflatten(-1, (-1, group_size))     # [O, G, g]
    partial = torch.einsum("tgk,ogk->tog", xg, qg)                            # [T, O, G]
    shift = zero.to(x.dtype)[None] * xg.sum(-1)[:, None, :]                   # [T, O, G]
    return ((partial - shift) * scale.to(x.dtype)[None]).sum(-1)


def dequant_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                   group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    # [T, I] -> [T, O]; accumulates in fp32 (or wider), casts back to x's dtype
    xa = x.to(_acc(x.dtype))
    if zero is None:
        out = F.linear(xa, qweight.to(xa.dtype)) * scale.to(xa.dtype)
    else:
        out = _int4_matmul(xa, qweight, scale, zero, group_size)
    if bias is not None:
        out = out + bias.to(xa.dtype)
    return out.to(x.dtype)


def dequant_matmul_native(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                          group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    # [T, I] -> [T, O]; the float weight in x's dtype, then an ordinary linear
    weight = dequantize_weight(qweight, scale, zero, group_size).to(x.dtype)
    return F.linear(x, weight, bias)
