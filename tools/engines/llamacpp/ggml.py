"""Read ggml graph tensors from inside llama.cpp's eval callback (`cb_eval` in llama_context_params).

ggml's scheduler asks the callback about every graph node twice: `ask=True` before computing it
("do you want this one?"; a yes makes the scheduler compute up to it and stop), then `ask=False`
once its data is ready. `GraphReader` answers the asks with a predicate on the node's name and
turns each wanted node into a `GraphNode`: name, op, type, numpy shape, its data (copied out with
ggml_backend_tensor_get, strides and quant blocks undone), its sources by name, op params.

A node is read right after it is computed, before any later node can reuse its buffer (ggml-alloc
recycles memory and computes some ops in place), so the data is the node's own. Its sources are
named, not copied: a source that is a graph node was read (if wanted) when it was computed, and a
leaf (a weight, `inp_pos`, the KQ mask) can be read with `read_leaves=True`.

The ggml functions come from the libggml-base that libllama itself loaded (the one mapped into this
process, else the folder llama_cpp loads from: LLAMA_CPP_LIB_PATH or the package's lib/), and
`struct ggml_tensor` is mirrored with ctypes from ggml/include/ggml.h (GGML_MAX_DIMS 4,
GGML_MAX_SRC 10, GGML_MAX_OP_PARAMS 64, GGML_MAX_NAME 64); the mirror is checked against
ggml_get_name on the first node read.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

MAX_DIMS, MAX_SRC, MAX_OP_PARAMS, MAX_NAME = 4, 10, 64, 64
# ggml_type ids (ggml.h enum ggml_type) stored as plain numpy types; the others are block-quantized
PLAIN_TYPES = {
    0: np.dtype(np.float32),
    1: np.dtype(np.float16),
    24: np.dtype(np.int8),
    25: np.dtype(np.int16),
    26: np.dtype(np.int32),
    27: np.dtype(np.int64),
    28: np.dtype(np.float64),
    30: np.dtype(np.uint16),  # bf16: the high half of a float32
}
BF16 = 30


class GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` (ggml.h); ne[0] is the fastest-varying dim, nb[i] its byte stride."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * MAX_DIMS),
        ("nb", ctypes.c_size_t * MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


@dataclass
class GraphNode:
    name: str  # ggml name: "Qcur-0", "ffn_out-1", "result_output", "node_12", "blk.0.attn_q.weight"
    op: str  # ggml_op_desc: "MUL_MAT", "ROPE", "RMS_NORM", "SILU", "SWIGLU", "NONE" (a leaf), ...
    type: str  # ggml_type_name: "f32", "f16", "q8_0", ...
    shape: tuple[int, ...]  # numpy order: (ne[n-1], ..., ne[0]), n = ggml_n_dims
    data: np.ndarray | None  # [shape] float32 (f16/bf16/quant types converted), ints as int64
    srcs: tuple[str, ...]  # names of the sources, in src[] order ("" where a slot in between is empty)
    op_params: bytes  # the 64 raw bytes of op_params
    ne: tuple[int, ...] = (1, 1, 1, 1)  # ggml's own ne[0..3]
    index: int = 0  # read order within the reader (ask=False calls), across graph evaluations


def lib_dir() -> Path:
    """The folder llama_cpp loads libllama from (LLAMA_CPP_LIB_PATH, else the package's lib/)."""
    import llama_cpp

    base = getattr(llama_cpp.llama_cpp, "_base_path", None)  # what llama_cpp resolved LLAMA_CPP_LIB_PATH to
    return Path(base) if base else Path(llama_cpp.__file__).parent / "lib"


def mapped_library(stem: str) -> Path | None:
    """The shared library `stem` (e.g. 'libggml-base') this process has mapped, if any (Linux)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    for line in maps.read_text().splitlines():
        parts = line.split(maxsplit=5)
        name = Path(parts[5]).name if len(parts) == 6 else ""
        if name == f"{stem}.so" or name.startswith(f"{stem}.so."):
            return Path(parts[5])
    return None


@cache
def ggml_base() -> ctypes.CDLL:
    """libggml-base as libllama loaded it, with the signatures this module calls."""
    import llama_cpp  # noqa: F401  (loads libllama, which maps its libggml-base)

    suffix = ".dylib" if sys.platform == "darwin" else ".so"
    path = mapped_library("libggml-base") or lib_dir() / f"libggml-base{suffix}"
    if not path.exists():
        raise FileNotFoundError(f"no libggml-base beside libllama in {lib_dir()}")
    lib = ctypes.CDLL(str(path))
    ptr = ctypes.c_void_p
    for fn, args, res in (
        ("ggml_get_name", [ptr], ctypes.c_char_p),
        ("ggml_op_desc", [ptr], ctypes.c_char_p),
        ("ggml_type_name", [ctypes.c_int], ctypes.c_char_p),
        ("ggml_nbytes", [ptr], ctypes.c_size_t),
        ("ggml_n_dims", [ptr], ctypes.c_int),
        ("ggml_blck_size", [ctypes.c_int], ctypes.c_int64),
        ("ggml_type_size", [ctypes.c_int], ctypes.c_size_t),
        ("ggml_backend_tensor_get", [ptr, ptr, ctypes.c_size_t, ctypes.c_size_t], None),
    ):
        getattr(lib, fn).argtypes, getattr(lib, fn).restype = args, res
    return lib


def raw_bytes(ptr: int) -> np.ndarray:
    """The tensor's bytes from its first to its last element (ggml_nbytes, views included), uint8."""
    lib = ggml_base()
    n = lib.ggml_nbytes(ptr)
    buf = np.empty(n, dtype=np.uint8)
    if n:
        lib.ggml_backend_tensor_get(ptr, buf.ctypes.data, 0, n)
    return buf


def to_numpy(t: GgmlTensor, raw: np.ndarray) -> np.ndarray:
    """raw bytes of tensor `t` -> [ne3, ne2, ne1, ne0] array: float32 for float/quant types, int64 for ints."""
    ne, nb = tuple(t.ne), tuple(t.nb)
    if t.type in PLAIN_TYPES:
        dtype = PLAIN_TYPES[t.type]
        x = _strided(raw, dtype, ne, nb)
        if t.type == BF16:
            return (x.astype(np.uint32) << 16).view(np.float32)
        return x.astype(np.int64) if dtype.kind == "i" else x.astype(np.float32)
    return dequantized_rows(t, raw)


def _strided(raw: np.ndarray, dtype: np.dtype, ne: tuple, nb: tuple) -> np.ndarray:
    # raw bytes + ggml ne/nb (elements / byte strides, fastest first) -> contiguous [ne3, ne2, ne1, ne0]
    padded: np.ndarray = np.zeros(raw.nbytes + dtype.itemsize, dtype=np.uint8)  # view() needs whole items at the end
    padded[: raw.nbytes] = raw
    base = padded[: (padded.nbytes // dtype.itemsize) * dtype.itemsize].view(dtype)
    x = np.lib.stride_tricks.as_strided(base, shape=ne[::-1], strides=nb[::-1], writeable=False)
    return np.array(x)


def dequantized_rows(t: GgmlTensor, raw: np.ndarray) -> np.ndarray:
    """A block-quantized tensor -> float32 [ne3, ne2, ne1, ne0], one row (ne0 values) at a time."""
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    lib = ggml_base()
    row_bytes = int(t.ne[0] // lib.ggml_blck_size(t.type) * lib.ggml_type_size(t.type))
    ne, nb = tuple(t.ne), tuple(t.nb)
    starts = [i1 * nb[1] + i2 * nb[2] + i3 * nb[3] for i3 in range(ne[3]) for i2 in range(ne[2]) for i1 in range(ne[1])]
    rows = np.stack([raw[s : s + row_bytes] for s in starts])
    values = quants.dequantize(rows, GGMLQuantizationType(t.type))
    return values.astype(np.float32).reshape(ne[::-1])


def tensor_name(ptr: int | None) -> str:
    return ggml_base().ggml_get_name(ptr).decode(errors="replace") if ptr else ""


def read_node(ptr: int, with_data: bool = True) -> GraphNode:
    """One ggml_tensor* -> GraphNode (data copied now, or None)."""
    lib = ggml_base()
    t = GgmlTensor.from_address(ptr)
    name = tensor_name(ptr)
    if t.name.decode(errors="replace") != name:
        raise RuntimeError(f"struct ggml_tensor mirror does not match this ggml build (name {name!r})")
    n_dims = max(1, lib.ggml_n_dims(ptr))
    data = to_numpy(t, raw_bytes(ptr)) if with_data else None
    shape = tuple(int(n) for n in t.ne[:n_dims])[::-1]
    srcs = [tensor_name(s) for s in t.src]
    while srcs and not srcs[-1]:
        srcs.pop()
    return GraphNode(
        name=name,
        op=lib.ggml_op_desc(ptr).decode(),
        type=lib.ggml_type_name(t.type).decode(),
        shape=shape,
        data=None if data is None else data.reshape(shape),
        srcs=tuple(srcs),
        op_params=bytes(bytearray(t.op_params)),
        ne=tuple(int(n) for n in t.ne),
    )


class GraphReader:
    """The eval callback: `want(name)` picks nodes, `on_node(GraphNode)` receives each one read.

    Use `reader.callback` as cb_eval (keep the reader alive while the context lives: ctypes frees
    the trampoline with it). An exception inside the callback cannot cross into C: it is kept,
    the graph runs on, and `check()` raises it afterwards."""

    def __init__(
        self,
        on_node: Callable[[GraphNode], None],
        want: Callable[[str], bool] | None = None,
        read_leaves: bool = False,
    ):
        import llama_cpp

        self.on_node, self.want, self.read_leaves = on_node, want, read_leaves
        self.count = 0
        self.leaves: dict[str, GraphNode] = {}
        self.error: BaseException | None = None
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._eval)

    def _eval(self, ptr: int, ask: bool, _user_data) -> bool:
        try:
            if ask:
                return self.error is None and (self.want is None or self.want(tensor_name(ptr)))
            node = read_node(ptr)
            node.index, self.count = self.count, self.count + 1
            if self.read_leaves:
                self._read_sources(ptr)
            self.on_node(node)
        except BaseException as e:  # noqa: BLE001  (kept for check(); C cannot unwind a Python error)
            self.error = self.error or e
        return True

    def _read_sources(self, ptr: int) -> None:
        """Leaf sources (weights, inputs) by name, read once: they are never computed, so never asked."""
        for src in GgmlTensor.from_address(ptr).src:
            name = tensor_name(src)
            if src and name not in self.leaves and GgmlTensor.from_address(src).op == 0:  # GGML_OP_NONE
                self.leaves[name] = read_node(src)

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"reading the ggml graph failed: {self.error!r}") from self.error
