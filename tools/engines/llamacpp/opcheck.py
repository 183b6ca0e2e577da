"""In the worker: judge every ggml graph node as llama.cpp computes it (the eval callback's side).

Each node's output is copied when its callback fires, because the graph allocator reuses buffers
and in-place ops overwrite their sources: a node's computed sources are taken from those copies
(keyed by tensor address: names repeat, `Qcur-0` is three nodes), and leaves (weights, token ids,
positions, masks, the KV cache) are read live at the consumer, where they are valid and current,
except the model's weights, which are read from the GGUF file: the CPU backend may hold them
repacked into an interleaved layout that cannot be read back (q4_0 on AVX2).
Each node is handed to `ops.judge` against its fp64 recompute; the verdicts, in graph order, name
the CPU function computing their op in the tree under test (`kernels.cpu_kernel`).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tools.engines.llamacpp import ggml, kernels, ops

GGML_OP_NONE = 0
SUB_OPS = ("UNARY", "GLU")  # ops whose kind is a second enum (ggml_op_desc names it)


def op_name(t: ggml.GgmlTensor) -> str:
    lib = ggml.ggml_base()
    lib.ggml_op_name.argtypes, lib.ggml_op_name.restype = [ctypes.c_int], ctypes.c_char_p
    return lib.ggml_op_name(t.op).decode()


def operand(node: ggml.GraphNode) -> ops.Operand:
    """A read node -> its values as a 4-d [ne3, ne2, ne1, ne0] tensor."""
    assert node.data is not None
    return ops.Operand(node.type, torch.from_numpy(np.ascontiguousarray(node.data).reshape(node.ne[::-1])))


def gguf_weights(path: Path) -> dict[str, Callable[[], ops.Operand]]:
    """Tensor name -> its values from a GGUF file (dequantized, read on first use, then kept)."""
    import gguf

    reader = gguf.GGUFReader(path)

    def loader(t) -> Callable[[], ops.Operand]:
        @functools.cache
        def load() -> ops.Operand:
            values: np.ndarray = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            ne = [int(n) for n in t.shape] + [1] * (4 - len(t.shape))
            return ops.Operand(t.tensor_type.name.lower(), torch.from_numpy(values.reshape(ne[::-1])))

        return load

    return {t.name: loader(t) for t in reader.tensors}


class OpChecker(ggml.GraphReader):
    """The eval callback with op checks: every node is computed one by one and judged; the nodes
    `want` picks still go to `on_node` for the taps."""

    def __init__(
        self,
        on_node: Callable[[ggml.GraphNode], None],
        want: Callable[[str], bool] | None,
        source: Path | None,
        weights: Path,
    ):
        super().__init__(on_node, want)
        self.source = source
        self.weights = gguf_weights(weights)
        self.outputs: dict[int, ops.Operand] = {}
        self.verdicts: list[ops.OpVerdict] = []
        self.calls: list[tuple[str, str, str]] = []  # per judged node index: (op, src0 type, sub)
        self.errors: list[str] = []

    def _eval(self, ptr: int, ask: bool, _user_data) -> bool:
        try:
            if ask:
                return self.error is None  # every node: each is judged right after it is computed
            node = ggml.read_node(ptr)
            node.index, self.count = self.count, self.count + 1
            self.observe(ptr, node)
            if self.want is None or self.want(node.name):
                self.on_node(node)
        except BaseException as e:  # noqa: BLE001  (kept for check(); C cannot unwind a Python error)
            self.error = self.error or e
        return True

    def observe(self, ptr: int, node: ggml.GraphNode) -> None:
        t = ggml.GgmlTensor.from_address(ptr)
        op = op_name(t)
        out = operand(node)
        srcs = tuple(self._source(s) for s in list(t.src)[: len(node.srcs)])
        self.outputs[ptr] = out
        call = ops.OpCall(op, node.name, node.type, out.data, srcs, node.op_params, node.op if op in SUB_OPS else "")
        index = len(self.calls)
        self.calls.append((op, srcs[0].type if srcs and srcs[0] is not None else "", call.sub))
        try:
            verdict = ops.judge(call, index)
        except Exception as e:  # an op the recompute cannot take (an unusual layout): say so, judge the rest
            self.errors.append(f"{ops.op_label(call)} {call.name}: {type(e).__name__}: {e}")
            return
        if verdict is not None:
            self.verdicts.append(verdict)

    def _source(self, ptr: int | None) -> ops.Operand | None:
        if not ptr:
            return None
        t = ggml.GgmlTensor.from_address(ptr)
        if t.op != GGML_OP_NONE and ptr in self.outputs:
            return self.outputs[ptr]  # computed in this graph: its copy from its own callback
        weight = self.weights.get(t.name.decode(errors="replace")) if t.op == GGML_OP_NONE else None
        return weight() if weight is not None else operand(ggml.read_node(ptr))

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
        kernel = kernels.cpu_kernel(self.source, op, src0_type, sub) if self.source else None
        return {
            **vars(v),
            "file": kernel.file if kernel else "",
            "function": kernel.function if kernel else "",
            "callers": list(kernel.chain) if kernel else [],
            "helpers": list(kernel.helpers) if kernel else [],
        }
