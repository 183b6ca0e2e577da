"""Each ggml op recomputed in fp64 from the inputs the engine gave it, to name the first wrong op.

llama.cpp has no native twin to swap a kernel for, but every graph node is visible in the eval
callback together with its sources, so each op can be judged on its own: its output against the
same op computed in fp64 by torch from the very inputs it was given. An op downstream of a wrong
one is given wrong inputs and still computes right from them, so the first op over its tolerance
in graph order is the one that computes wrong.

Tensors here are torch tensors in ggml's logical order reversed: a ggml tensor with
ne = [ne0, ne1, ne2, ne3] (ne0 contiguous) is a [ne3, ne2, ne1, ne0] tensor. The semantics follow
ggml/src/ggml.c (op construction, op_params) and ggml/src/ggml-cpu/ops.cpp (the CPU kernels).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tools.probe import compare

F64 = torch.float64


@dataclass
class Operand:
    """One source of an op: its ggml type name ("f32", "f16", "q8_0", "i32", ...) and values."""

    type: str
    data: torch.Tensor  # [ne3, ne2, ne1, ne0]; floats dequantized, integers as integers


@dataclass
class OpCall:
    """One computed graph node as the engine produced it."""

    op: str  # ggml_op_name: "MUL_MAT", "UNARY", "GLU", ...
    name: str  # the node's name ("attn_norm-0")
    type: str  # its output type name
    out: torch.Tensor  # [ne3, ne2, ne1, ne0] what the engine computed
    srcs: tuple[Operand | None, ...]
    op_params: bytes = b""
    sub: str = ""  # UNARY / GLU: which one (ggml_unary_op_name / ggml_glu_op_name: "SILU", "SWIGLU")


def params_i32(call: OpCall, n: int) -> tuple[int, ...]:
    return struct.unpack_from(f"<{n}i", call.op_params.ljust(4 * n, b"\0"))


def params_f32(call: OpCall, start: int, n: int) -> tuple[float, ...]:
    return struct.unpack_from(f"<{n}f", call.op_params.ljust(4 * (start + n), b"\0"), 4 * start)


# --- the ops in fp64 (pure) ------------------------------------------------------------------------


def mul_mat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [A3, A2, M, K], b [B3, B2, N, K] -> [B3, B2, N, M]; batch i of b uses a's batch i // (B/A)."""
    a = a.repeat_interleave(b.shape[0] // a.shape[0], 0).repeat_interleave(b.shape[1] // a.shape[1], 1)
    return b.to(F64) @ a.to(F64).transpose(-1, -2)


def tile_to(b: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """ggml's binary-op broadcast: b's index along each dim is i % b.shape[d] (b tiled over a)."""
    return b.repeat(*(n // m for n, m in zip(shape, b.shape, strict=True)))


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:  # [..., D] -> [..., D]
    x = x.to(F64)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:  # [..., D] -> [..., D], no affine
    x = x.to(F64) - x.to(F64).mean(-1, keepdim=True)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def yarn_corr_dims(
    n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float
) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the dims between which YaRN ramps from interpolation to extrapolation."""

    def dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(dim(beta_fast))), min(n_dims - 1.0, math.ceil(dim(beta_slow)))


@dataclass(frozen=True)
class Rope:
    """ROPE's op_params (ggml_rope_impl): int32 [_, n_dims, mode, _, n_ctx_orig], floats from slot 5."""

    n_dims: int
    mode: int  # 0 normal (adjacent pairs), 2 NEOX (halves); mrope/vision are not judged here
    n_ctx_orig: int
    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float
    beta_slow: float

    @classmethod
    def of(cls, call: OpCall) -> Rope:
        _, n_dims, mode, _, n_ctx_orig = params_i32(call, 5)
        return cls(n_dims, mode, n_ctx_orig, *params_f32(call, 5, 6))


def rope_angles(pos: torch.Tensor, r: Rope, freq_factors: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[T] positions -> ([T, n_dims/2] theta, [] magnitude): rope_yarn's angle per pair and its mscale."""
    k = torch.arange(r.n_dims // 2, dtype=F64)
    extrap = pos.to(F64)[:, None] * r.freq_base ** (-2.0 * k / r.n_dims)
    if freq_factors is not None:
        extrap = extrap / freq_factors.to(F64).flatten()[: r.n_dims // 2]
    theta = r.freq_scale * extrap
    mscale = r.attn_factor
    if r.ext_factor != 0.0:
        low, high = yarn_corr_dims(r.n_dims, r.n_ctx_orig, r.freq_base, r.beta_fast, r.beta_slow)
        ramp = 1 - ((k - low) / max(0.001, high - low)).clamp(0, 1)
        mix = ramp * r.ext_factor
        theta = theta * (1 - mix) + extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / r.freq_scale)
    return theta, torch.tensor(mscale, dtype=F64)


def rope(x: torch.Tensor, pos: torch.Tensor, r: Rope, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, T, H, D], pos [T] -> [B, T, H, D]: the first n_dims of each head rotated, the rest kept.
    Normal mode pairs (2i, 2i+1); NEOX pairs (i, i + n_dims/2)."""
    theta, mscale = rope_angles(pos, r, freq_factors)
    cos, sin = (torch.cos(theta) * mscale)[None, :, None], (torch.sin(theta) * mscale)[None, :, None]
    x = x.to(F64)
    rot, rest = x[..., : r.n_dims], x[..., r.n_dims :]
    if r.mode == 0:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)
    else:
        x0, x1 = rot[..., : r.n_dims // 2], rot[..., r.n_dims // 2 :]
        out = torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1)
    return torch.cat((out, rest), -1)


def alibi_slopes(n_head: int, max_bias: float) -> torch.Tensor:
    """[H] per-head mask multipliers (ALiBi when max_bias > 0, else 1), as ggml's soft_max computes them."""
    if max_bias <= 0.0:
        return torch.ones(n_head, dtype=F64)
    log2 = 1 << int(math.floor(math.log2(n_head)))
    m0, m1 = 2.0 ** (-max_bias / log2), 2.0 ** (-max_bias / 2.0 / log2)
    return torch.tensor([m0 ** (h + 1) if h < log2 else m1 ** (2 * (h - log2) + 1) for h in range(n_head)], dtype=F64)


def mask_for(mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A [M3, M2, R', C] mask (rows may be padded past R) -> [B, H, R, C]: rows cut, heads/batches tiled."""
    return tile_to(mask[:, :, : shape[2], : shape[3]].to(F64), shape)


def soft_max(
    x: torch.Tensor, mask: torch.Tensor | None, scale: float, max_bias: float, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """x [B, H, R, C] -> softmax(x·scale + slope_h·mask) over C; a sink per head joins the denominator."""
    w = x.to(F64) * scale
    if mask is not None:
        w = w + alibi_slopes(x.shape[1], max_bias)[None, :, None, None] * mask_for(mask, w.shape)
    if sinks is None:
        return torch.softmax(w, -1)
    sink = sinks.to(F64).flatten()[None, :, None, None].expand(*w.shape[:3], 1)
    return torch.softmax(torch.cat((w, sink), -1), -1)[..., :-1]


def flash_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    max_bias: float,
    softcap: float,
) -> torch.Tensor:
    """q [B, H, N, D], k [B, Hkv, M, D], v [B, Hkv, M, Dv], mask [.., N', M] -> [B, N, H, Dv]
    (FLASH_ATTN_EXT's output is permuted: heads inside tokens). Head h reads kv head h // (H/Hkv)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.to(F64).repeat_interleave(rep, 1), v.to(F64).repeat_interleave(rep, 1)
    s = q.to(F64) @ k.transpose(-1, -2) * scale
    if softcap != 0.0:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s + alibi_slopes(q.shape[1], max_bias)[None, :, None, None] * mask_for(mask, s.shape)
    return (torch.softmax(s, -1) @ v).transpose(1, 2)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * x * (1.0 + 0.044715 * x * x)))


# ggml_unary_op / ggml_glu_op activations by name (ggml_unary_op_name, ggml_glu_op_name), in fp64
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "SILU": lambda x: x * torch.sigmoid(x),
    "GELU": gelu_tanh,
    "GELU_ERF": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "GELU_QUICK": lambda x: x * torch.sigmoid(1.702 * x),
    "RELU": torch.relu,
    "SIGMOID": torch.sigmoid,
    "TANH": torch.tanh,
    "NEG": torch.neg,
    "EXP": torch.exp,
    "ABS": torch.abs,
}
GLU_ACTIVATION = {
    "SWIGLU": "SILU",
    "GEGLU": "GELU",
    "REGLU": "RELU",
    "GEGLU_ERF": "GELU_ERF",
    "GEGLU_QUICK": "GELU_QUICK",
}


def glu(a: torch.Tensor, b: torch.Tensor | None, act: str, swapped: bool) -> torch.Tensor:
    """act(gate) * up. Fused form (b None): a [..., 2F] holds gate | up (up | gate when swapped)."""
    a = a.to(F64)
    if b is None:
        half = a.shape[-1] // 2
        a, b = a[..., :half], a[..., half:]
    if swapped:
        a, b = b, a
    return ACTIVATIONS[act](a) * b.to(F64)


def get_rows(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """table [A3, A2, R, D], idx [1, I2, I1, I0] ints -> [I2, I1, I0, D]: out[c, b, a] = table[c, b, idx[c, b, a]]."""
    i2, i1, i0 = idx.shape[1:]
    c = torch.arange(i2)[:, None, None].expand(i2, i1, i0) % table.shape[0]
    b = torch.arange(i1)[None, :, None].expand(i2, i1, i0) % table.shape[1]
    return table.to(F64)[c, b, idx[0].long()]


def set_rows(dst: torch.Tensor, src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """dst [D3, D2, R, D] (the target tensor after the op), src [D3, D2, N, D] rows, idx [1, I2, I1, N] ints
    (tiled over src's batches) -> dst with row idx[n] replaced by src's row n; the rows the op does not
    write are taken as they are."""
    out = dst.to(F64).clone()
    for i3 in range(src.shape[0]):
        for i2 in range(src.shape[1]):
            rows = idx[0, i3 % idx.shape[1], i2 % idx.shape[2]].long()
            out[i3, i2, rows] = src[i3, i2].to(F64)
    return out


def permute(x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    """ggml_permute(a, ax0..ax3): source dim i (ne order) becomes dim axes[i]. [4-d] -> [4-d]."""
    order = [0] * 4
    for i, ax in enumerate(axes):
        order[ax] = i
    return x.permute(3, 2, 1, 0).permute(*order).permute(3, 2, 1, 0)


# --- what the CPU kernels round by design (not a bug, so the recompute does it too) ----------------

FLOAT_TYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}


def round_to(x: torch.Tensor, type_name: str) -> torch.Tensor:
    """Values as stored in a tensor of that ggml type (floats only; others are left in fp64)."""
    dtype = FLOAT_TYPES.get(type_name)
    return x.to(dtype).to(F64) if dtype is not None else x.to(F64)


def quantize_q8(x: torch.Tensor, block: int, fp16_scale: bool) -> torch.Tensor:
    """[..., K] -> [..., K] values after ggml's symmetric 8-bit row quantization (q8_0: blocks of 32,
    scale stored in fp16; q8_K: blocks of 256, fp32 scale), the type a quantized dot product
    converts its activations to."""
    blocks = x.to(F64).reshape(*x.shape[:-1], -1, block)
    d = blocks.abs().amax(-1, keepdim=True) / 127.0
    q = torch.round(blocks * torch.where(d > 0, 1.0 / d, torch.zeros_like(d)))
    d = d.to(torch.float16).to(F64) if fp16_scale else d.to(torch.float32).to(F64)
    return (q * d).reshape(x.shape)


def vec_dot_operand(b: torch.Tensor, weight_type: str) -> torch.Tensor:
    """MUL_MAT converts src1 to the weight type's vec_dot_type before the dot products."""
    if weight_type in ("f16", "bf16"):
        return round_to(b, weight_type)
    if weight_type.startswith(("q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq")):
        return quantize_q8(b, 256, fp16_scale=False) if b.shape[-1] % 256 == 0 else b.to(F64)
    if weight_type.startswith("q"):
        return quantize_q8(b, 32, fp16_scale=True) if b.shape[-1] % 32 == 0 else b.to(F64)
    return b.to(F64)


# --- op -> recompute from its call (pure) -----------------------------------------------------------


def _src(call: OpCall, i: int) -> torch.Tensor:
    operand = call.srcs[i]
    assert operand is not None, f"{call.op} {call.name}: source {i} missing"
    return operand.data


def _opt(call: OpCall, i: int) -> torch.Tensor | None:
    operand = call.srcs[i] if i < len(call.srcs) else None
    return None if operand is None else operand.data


def _mul_mat(call: OpCall) -> torch.Tensor:
    weight = call.srcs[0]
    assert weight is not None
    return mul_mat(weight.data, vec_dot_operand(_src(call, 1), weight.type))


def _binary(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[OpCall], torch.Tensor]:
    def recompute(call: OpCall) -> torch.Tensor:
        a = _src(call, 0).to(F64)
        return fn(a, tile_to(_src(call, 1).to(F64), a.shape))

    return recompute


def _scale(call: OpCall) -> torch.Tensor:
    s, b = params_f32(call, 0, 2)
    return _src(call, 0).to(F64) * s + b


def _rope(call: OpCall) -> torch.Tensor | None:
    r = Rope.of(call)
    if r.mode not in (0, 2):  # mrope / vision: sections per position axis, not judged here
        return None
    return rope(_src(call, 0), _src(call, 1).flatten(), r, _opt(call, 2))


def _soft_max(call: OpCall) -> torch.Tensor:
    scale, max_bias = params_f32(call, 0, 2)
    return soft_max(_src(call, 0), _opt(call, 1), scale, max_bias, _opt(call, 2))


def _flash_attn(call: OpCall) -> torch.Tensor:
    scale, max_bias, softcap = params_f32(call, 0, 3)
    k = call.srcs[1]
    assert k is not None
    q = round_to(_src(call, 0), k.type)  # the CPU kernel converts Q to K's type for its dot products
    return flash_attn(q, k.data, _src(call, 2), _opt(call, 3), scale, max_bias, softcap)


def _unary(call: OpCall) -> torch.Tensor | None:
    act = ACTIVATIONS.get(call.sub)
    return None if act is None else act(_src(call, 0).to(F64))


def _glu(call: OpCall) -> torch.Tensor | None:
    act = GLU_ACTIVATION.get(call.sub)
    return None if act is None else glu(_src(call, 0), _opt(call, 1), act, bool(params_i32(call, 2)[1]))


def _same_values(call: OpCall) -> torch.Tensor:
    """CPY / DUP / CONT / RESHAPE: the source's elements in row-major order, in the output's shape."""
    return _src(call, 0).to(F64).reshape(call.out.shape)


def _permute(call: OpCall) -> torch.Tensor:
    return permute(_src(call, 0), params_i32(call, 4) if call.op == "PERMUTE" else (1, 0, 2, 3))


RECOMPUTE: dict[str, Callable[[OpCall], torch.Tensor | None]] = {
    "MUL_MAT": _mul_mat,
    "ADD": _binary(torch.add),
    "SUB": _binary(torch.sub),
    "MUL": _binary(torch.mul),
    "DIV": _binary(torch.div),
    "SCALE": _scale,
    "RMS_NORM": lambda c: rms_norm(_src(c, 0), params_f32(c, 0, 1)[0]),
    "NORM": lambda c: layer_norm(_src(c, 0), params_f32(c, 0, 1)[0]),
    "ROPE": _rope,
    "SOFT_MAX": _soft_max,
    "FLASH_ATTN_EXT": _flash_attn,
    "UNARY": _unary,
    "GLU": _glu,
    "GET_ROWS": lambda c: get_rows(_src(c, 0), _src(c, 1)),
    "SET_ROWS": lambda c: set_rows(c.out, _src(c, 0), _src(c, 1)),
    "CPY": _same_values,
    "DUP": _same_values,
    "CONT": _same_values,
    "RESHAPE": _same_values,
    "PERMUTE": _permute,
    "TRANSPOSE": _permute,
}
LAYOUT_OPS = ("CPY", "DUP", "CONT", "RESHAPE", "PERMUTE", "TRANSPOSE", "VIEW", "GET_ROWS", "SET_ROWS")


def recompute(call: OpCall) -> torch.Tensor | None:
    """The op's output in fp64 from its own inputs, stored as the output's type; None: not judged."""
    fn = RECOMPUTE.get(call.op)
    y = fn(call) if fn is not None else None
    return None if y is None else round_to(y, call.type)


# --- judging an op: its output against the recompute, by the probe's robust error ratio -------------

# Relative noise floor of a correct CPU kernel, per op where it differs from fp32 summation noise:
# FLASH_ATTN_EXT accumulates V·softmax in V's type (fp16 for the default KV cache), GELU reads an
# fp16 table; a quantized MUL_MAT rounds its activations' block scales.
# Calibrated so the bug-free build has no op over the threshold (tests/tools/engines/llamacpp/test_ops.py).
DEFAULT_FLOOR = compare.NOISE_FLOOR["float32"]
LOW_PRECISION_FLOOR = {"f16": compare.NOISE_FLOOR["float16"], "bf16": compare.NOISE_FLOOR["bfloat16"]}
OP_FLOOR = {("UNARY", "GELU"): compare.NOISE_FLOOR["float16"], ("GLU", "GEGLU"): compare.NOISE_FLOOR["float16"]}
QUANT_MUL_MAT_FLOOR = 1e-4
# Weight types the x86 CPU backend repacks into interleaved blocks (ggml-cpu/repack.cpp): their GEMM
# quantizes activations four rows at a time and differs from the q8_0 rounding above by up to 0.9 %
# on some rows of a bug-free build (q4_0, measured on tiny llama and qwen2), so they get a loose floor
# (a wrong nibble order or scale errs by tens of percent).
REPACKED = ("q4_0", "iq4_nl", "q4_K", "q2_K")
REPACKED_MUL_MAT_FLOOR = 1e-2
FLASH_ATTN_FLOOR = 1e-4  # fp32 K/V: online softmax over tiles, measured 1.2e-5 on a bug-free build


def noise_floor(call: OpCall) -> float:
    types = [s.type for s in call.srcs if s is not None]
    if call.op == "FLASH_ATTN_EXT" and len(types) > 2:
        return LOW_PRECISION_FLOOR.get(types[2], FLASH_ATTN_FLOOR)
    if call.op == "MUL_MAT" and types and types[0].startswith(("q", "iq")):
        return REPACKED_MUL_MAT_FLOOR if types[0] in REPACKED else QUANT_MUL_MAT_FLOOR
    return OP_FLOOR.get((call.op, call.sub), DEFAULT_FLOOR)  # fp16 results: the recompute rounds the same


@dataclass
class OpVerdict:
    """One op judged against its recompute (plain data: travels as JSON from the worker)."""

    index: int  # graph order over the whole run (evaluations in order, nodes in order)
    op: str  # "RMS_NORM", or "UNARY(SILU)" / "GLU(SWIGLU)"
    name: str
    types: list[str]  # the output's type, then the sources'
    ratio: float  # worst row's relative error / noise floor
    error: float  # worst row's relative error
    floor: float
    nonfinite: bool

    def wrong(self, threshold: float = compare.THRESHOLD) -> bool:
        return self.nonfinite or self.ratio > threshold


def op_label(call: OpCall) -> str:
    return f"{call.op}({call.sub})" if call.sub else call.op


def as_rows(x: torch.Tensor) -> torch.Tensor:  # [..., D] -> [rows, D]
    return x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)


def judge(call: OpCall, index: int) -> OpVerdict | None:
    """The op's output against its fp64 recompute; None for an op with nothing to judge."""
    y = recompute(call)
    if y is None or y.numel() == 0:
        return None
    floor = noise_floor(call)
    t, y = as_rows(call.out.to(F64)), as_rows(y)
    ratio, err, _, nonfinite = compare.robust_ratio(t, y, y, floor)
    types = [call.type] + [s.type if s is not None else "-" for s in call.srcs]
    return OpVerdict(index, op_label(call), call.name, types, float(ratio.max()), float(err.max()), floor, nonfinite)


def first_wrong(verdicts: list[OpVerdict], threshold: float = compare.THRESHOLD) -> OpVerdict | None:
    """The earliest op in graph order that computes wrong from its own inputs."""
    return next((v for v in sorted(verdicts, key=lambda v: v.index) if v.wrong(threshold)), None)
