"""Weight-only quantization math, diffdx's own copy (no engine code imported).

The reference for a quantized target runs the *dequantized* weights, so diffdx must
reproduce the target's quantize -> dequantize round trip bit for bit. A target run says
which scheme it used in its trace meta (`weights`, set by its adapter). Schemes (the
contract both sides implement):

    int8  per output channel, symmetric:   scale = amax|w_row| / 127, q = round(w / scale) in [-127, 127]
    int4  per group of `group_size` input columns, asymmetric:
          scale = (max - min) / 15, zero = clamp(round(-min / scale), 0, 15),
          q = clamp(round(w / scale) + zero, 0, 15), two q per byte (even column in the low nibble)

Everything is computed in float32; `dequantize(quantize(w))` is what both engines multiply by.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

SCHEMES = ("int8", "int4")
DEFAULT_GROUP_SIZE = 32
# checkpoint tensors that are quantized: the decoder layers' projection weights
QUANTIZED_SUFFIXES = tuple(f"{p}_proj.weight" for p in ("q", "k", "v", "o", "gate", "up", "down"))
_TINY = torch.finfo(torch.float32).tiny


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # [O, I] -> (q int8 [O, I], scale fp32 [O])
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(_TINY)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # (q [O, I], scale [O]) -> w [O, I] fp32
    return q.float() * scale[:, None]


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # [O, I] -> (packed uint8 [O, I/2], scale fp32 [O, I/g], zero uint8 [O, I/g])
    out_f, in_f = w.shape
    check_int4_shape(in_f, group_size)
    g = w.float().reshape(out_f, in_f // group_size, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = ((hi - lo) / 15.0).clamp_min(_TINY)
    zero = torch.round(-lo / scale).clamp(0, 15)
    q = (torch.round(g / scale[..., None]) + zero[..., None]).clamp(0, 15).to(torch.uint8)
    q = q.reshape(out_f, in_f)
    return q[:, 0::2] | (q[:, 1::2] << 4), scale, zero.to(torch.uint8)


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    # (packed [O, I/2], scale [O, I/g], zero [O, I/g]) -> w [O, I] fp32
    out_f = packed.shape[0]
    q = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(out_f, -1, group_size)
    return ((q.float() - zero.float()[..., None]) * scale[..., None]).reshape(out_f, -1)


def check_int4_shape(in_features: int, group_size: int) -> None:
    if group_size < 2 or group_size % 2 or in_features % group_size:
        raise ValueError(
            f"int4 needs an even group size dividing in_features; got group {group_size} "
            f"for {in_features} input features"
        )


def round_trip(w: torch.Tensor, scheme: str, group_size: int = DEFAULT_GROUP_SIZE) -> torch.Tensor:
    """The weight a quantized engine effectively multiplies by: dequantize(quantize(w)), fp32."""
    if scheme == "int8":
        return dequantize_int8(*quantize_int8(w))
    if scheme == "int4":
        return dequantize_int4(*quantize_int4(w, group_size), group_size)
    raise ValueError(f"unknown quantization {scheme!r}; known: {', '.join(SCHEMES)}")


def is_quantized(name: str) -> bool:
    return name.endswith(QUANTIZED_SUFFIXES)


# ---- files ------------------------------------------------------------------------------------


def dequantized_dir(checkpoint: Path, scheme: str, group_size: int) -> Path:
    suffix = "int8" if scheme == "int8" else f"int4-g{group_size}"
    return checkpoint.parent / f"{checkpoint.name}.dequant-{suffix}"


def ensure_dequantized(checkpoint: str | Path, scheme: str, group_size: int = DEFAULT_GROUP_SIZE) -> Path:
    """A copy of `checkpoint` whose projection weights went through the round trip; written once."""
    from safetensors.torch import load_file, save_file

    src = Path(checkpoint)
    out = dequantized_dir(src, scheme, group_size)
    if (out / "quantization.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors"))
    for f in sorted(src.glob("*.safetensors")):
        tensors = load_file(str(f))
        # round-tripped weights stay fp32: a narrower store would round them a second time
        save_file(
            {k: (round_trip(v, scheme, group_size) if is_quantized(k) else v) for k, v in tensors.items()},
            str(tmp / f.name),
            metadata={"format": "pt"},
        )
    (tmp / "quantization.json").write_text(json.dumps({"scheme": scheme, "group_size": group_size}))
    try:
        tmp.rename(out)
    except OSError:  # another process wrote the same copy first
        shutil.rmtree(tmp, ignore_errors=True)
    return out
