"""Weight-only quantization at load time (engine option `quantization`).

The decoder layers' projections (qkv_proj, o_proj, gate_up_proj, down_proj) are
quantized from the checkpoint's float32 values right after loading; embeddings,
norms and the LM head stay in the model dtype.

    int8  per output channel, symmetric:  s = max|w_row| / 127,  q = round(w / s) in [-127, 127]
    int4  per `quant_group_size` input columns, asymmetric: s = (max - min) / 15,
          z = round(-min / s) in [0, 15],  q = round(w / s) + z in [0, 15], packed two per byte

Fused projections quantize row by row, so a fused qkv weight quantizes exactly
like its q, k and v parts would on their own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tinyserve.config import Config
from tinyserve.layers.linear import LinearBase

# scales are floored here so an all-zero row or group still dequantizes to zeros
MIN_SCALE = torch.finfo(torch.float32).tiny


def quantize_per_channel_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # [O, I] float -> (int8 [O, I], scale [O] fp32)
    w32 = w.to(torch.float32)
    scale = torch.clamp_min(w32.abs().max(dim=-1).values / 127.0, MIN_SCALE)
    return torch.round(w32 / scale.unsqueeze(-1)).clamp(-127, 127).to(torch.int8), scale


def quantize_group_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # [O, I] float -> (packed uint8 [O, I/2], scale [O, G] fp32, zero point uint8 [O, G])
    rows, cols = w.shape
    if group_size % 2 or cols % group_size:
        raise ValueError(f"int4: quant_group_size {group_size} must be even and divide {cols} input features")
    groups = w.to(torch.float32).view(rows, cols // group_size, group_size)
    lo, hi = torch.aminmax(groups, dim=-1)
    scale = torch.clamp_min((hi - lo) / 15.0, MIN_SCALE)
    zero = torch.clamp(torch.round(-lo / scale), 0, 15)
    q = torch.clamp(torch.round(groups / scale.unsqueeze(-1)) + zero.unsqueeze(-1), 0, 15).to(torch.uint8)
    pairs = q.view(rows, cols // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4), scale, zero.to(torch.uint8)


@dataclass
class QuantizedWeight:
    """A layer's packed weight and the kernel that multiplies by it (plain tensors: `model.to(dtype)`
    must not round the scales)."""
    qweight: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group_size: int
    kernel: object

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.kernel(x, self.qweight, self.scale, self.zero, self.group_size, bias)


def quantize_weight(w: torch.Tensor, scheme: str, group_size: int, kernel) -> QuantizedWeight:
    if scheme == "int8":
        q, s = quantize_per_channel_int8(w)
        return QuantizedWeight(q, s, None, 0, kernel)
    q, s, z = quantize_group_int4(w, group_size)
    return QuantizedWeight(q, s, z, group_size, kernel)


def quantize_linears(model: nn.Module, scheme: str, group_size: int, kernel) -> int:
    """Replace the float weight of every decoder-layer linear by its quantized form; -> count."""
    count = 0
    for name, module in model.named_modules():
        if isinstance(module, LinearBase) and ".layers." in f".{name}":
            module.quant = quantize_weight(module.weight.data, scheme, group_size, kernel)
            del module.weight      # the packed weight is the only copy left
            count += 1
    return count


def load_quantized_model(config: Config) -> nn.Module:
    """Build and load in float32, quantize, then cast what is left to the model dtype."""
    from tinyserve.model_loader import load_weights
    from tinyserve.models import get_model_class
    from tinyserve.ops import select_kernels

    kernels = select_kernels(config.native_kernels)
    cfg = config.model_config
    model = get_model_class(cfg.model_type)(cfg, kernels, config.max_model_len)
    load_weights(model, config.model)
    quantize_linears(model, config.quantization, config.quant_group_size, kernels.dequant_matmul)
    model.to(config.torch_dtype)
    return model.eval()
