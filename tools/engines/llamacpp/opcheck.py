"""In the worker: judge every ggml graph node as llama.cpp computes it (the eval callback's side).

Each node's output is copied when its callback fires, because the graph allocator reuses buffers
and in-place ops overwrite their sources: a node's computed sources are taken from those copies,
and only leaves (weights, token ids, positions, masks, the KV cache) are read live, where they
stay valid. Each node is then handed to `ops.judge` against its fp64 recompute, and the verdicts,
in graph order, name their CPU function from the tree under test (`kernels.cpu_kernel`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import torch

from tools.engines.llamacpp import kernels, ops

GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME = 4, 10, 64, 64


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor (ggml/include/ggml.h of the vendored llama.cpp)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


PLAIN = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i8": np.int8, "i16": np.int16}
PLAIN |= {"i32": np.int32, "i64": np.int64, "bf16": np.uint16}


class Ggml:
    """The few libggml-base calls that name a tensor's type and op."""

    def __init__(self, lib_dir: Path):
        self.lib = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        for fn in ("ggml_type_name", "ggml_op_name", "ggml_unary_op_name", "ggml_glu_op_name"):
            getattr(self.lib, fn).restype = ctypes.c_char_p
            getattr(self.lib, fn).argtypes = [ctypes.c_int]
        for fn in ("ggml_get_unary_op", "ggml_get_glu_op"):
            getattr(self.lib, fn).restype = ctypes.c_int
            getattr(self.lib, fn).argtypes = [ctypes.c_void_p]

    def type_name(self, t: GgmlTensor) -> str:
        return self.lib.ggml_type_name(t.type).decode()

    def op_name(self, t: GgmlTensor) -> str:
        return self.lib.ggml_op_name(t.op).decode()

    def sub_name(self, op: str, addr: int) -> str:
        if op == "UNARY":
            return self.lib.ggml_unary_op_name(self.lib.ggml_get_unary_op(addr)).decode()
        if op == "GLU":
            return self.lib.ggml_glu_op_name(self.lib.ggml_get_glu_op(addr)).decode()
        return ""


def read_values(t: GgmlTensor, type_name: str) -> torch.Tensor:
    """A tensor's logical values through its strides -> [ne3, ne2, ne1, ne0] (floats dequantized)."""
    shape = tuple(reversed(list(t.ne)))
    strides = tuple(reversed(list(t.nb)))
    if not t.data or 0 in shape:
        return torch.zeros(shape)
    if type_name in PLAIN:
        span = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + np.dtype(PLAIN[type_name]).itemsize
        base = np.frombuffer((ctypes.c_char * span).from_address(t.data), dtype=np.uint8)
        view = np.lib.stride_tricks.as_strided(base.view(PLAIN[type_name]), shape, strides, writeable=False)
        if type_name == "bf16":
            return torch.from_numpy((view.astype(np.uint32) << 16).view(np.float32).copy())
        return torch.from_numpy(np.array(view))
    return _dequantize(t, type_name, shape, strides)


def _dequantize(t: GgmlTensor, type_name: str, shape: tuple, strides: tuple) -> torch.Tensor:
    """Quantized rows (contiguous within a row) -> floats, by the gguf package's reference dequantizers."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[type_name.upper()]
    row_bytes = (shape[3] // qtype_block(qtype)[0]) * qtype_block(qtype)[1]
    rows = [
        np.frombuffer(
            (ctypes.c_char * row_bytes).from_address(t.data + i3 * strides[0] + i2 * strides[1] + i1 * strides[2]),
            np.uint8,
        )
        for i3 in range(shape[0])
        for i2 in range(shape[1])
        for i1 in range(shape[2])
    ]
    return torch.from_numpy(dequantize(np.stack(rows), qtype).reshape(shape).astype(np.float32))


def qtype_block(qtype) -> tuple[int, int]:
    from gguf.constants import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[qtype]


class OpChecker:
    """Called from the eval callback with each computed node's address; keeps the verdicts."""

    def __init__(self, lib_dir: Path, source: Path | None):
        self.ggml = Ggml(lib_dir)
        self.source = source
        self.outputs: dict[int, ops.Operand] = {}
        self.verdicts: list[ops.OpVerdict] = []
        self.calls: dict[int, tuple[str, str, str]] = {}  # verdict index -> (op, src0 type, sub)
        self.errors: list[str] = []

    def observe(self, addr: int) -> None:
        t = GgmlTensor.from_address(addr)
        op, type_name = self.ggml.op_name(t), self.ggml.type_name(t)
        out = ops.Operand(type_name, read_values(t, type_name))
        srcs = tuple(self._operand(t.src[i]) for i in range(_n_srcs(t)))
        self.outputs[addr] = out
        call = ops.OpCall(
            op,
            t.name.decode(errors="replace"),
            type_name,
            out.data,
            srcs,
            bytes(t.op_params),
            self.ggml.sub_name(op, addr),
        )
        index = len(self.calls)
        self.calls[index] = (op, srcs[0].type if srcs and srcs[0] else "", call.sub)
        try:
            verdict = ops.judge(call, index)
        except Exception as e:  # an op the recompute cannot take (an unusual layout): say so, judge the rest
            self.errors.append(f"{ops.op_label(call)} {call.name}: {type(e).__name__}: {e}")
            return
        if verdict is not None:
            self.verdicts.append(verdict)

    def _operand(self, addr: int | None) -> ops.Operand | None:
        if not addr:
            return None
        src = GgmlTensor.from_address(addr)
        if src.op != 0 and addr in self.outputs:  # computed in this graph: its copy from its own callback
            return self.outputs[addr]
        type_name = self.ggml.type_name(src)
        return ops.Operand(type_name, read_values(src, type_name))

    def new_graph(self) -> None:
        """A new evaluation starts: the copies of the last one's nodes are not its sources."""
        self.outputs.clear()

    def report(self, keep: int = 20) -> dict:
        """JSON for the trace meta: how many ops were judged, the worst ratio per op, and the first
        `keep` wrong ones in graph order, each with the CPU function that computes it."""
        per_op: dict[str, dict] = {}
        for v in self.verdicts:
            stat = per_op.setdefault(v.op, {"judged": 0, "wrong": 0, "max_ratio": 0.0})
            stat["judged"] += 1
            stat["wrong"] += int(v.wrong())
            stat["max_ratio"] = max(stat["max_ratio"], v.ratio)
        wrong = [self._record(v) for v in self.verdicts if v.wrong()][:keep]
        return {"judged": len(self.verdicts), "ops": per_op, "wrong": wrong, "errors": self.errors[:keep]}

    def _record(self, v: ops.OpVerdict) -> dict:
        op, src0_type, sub = self.calls[v.index]
        kernel = self._kernel(op, src0_type, sub)
        return {
            **vars(v),
            "file": kernel.file if kernel else "",
            "function": kernel.function if kernel else "",
            "callers": list(kernel.chain) if kernel else [],
        }

    def _kernel(self, op: str, src0_type: str, sub: str) -> kernels.Kernel | None:
        return kernels.cpu_kernel(self.source, op, src0_type, sub) if self.source else None


def _n_srcs(t: GgmlTensor) -> int:
    last = max((i for i in range(GGML_MAX_SRC) if t.src[i]), default=-1)
    return last + 1
