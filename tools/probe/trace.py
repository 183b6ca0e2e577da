"""Traces: what one engine run produced (tap records + outputs), and their files.

On disk a trace is `taps.safetensors` (one tensor per record) plus `trace.json`
(record index, per-request outputs, run metadata), so it can cross a process
boundary and be reloaded lazily.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch


@dataclass(slots=True)  # no __dict__: a trace of a deep model holds tens of thousands of records
class TapRecord:
    name: str  # canonical tap name (tools.probe.taps)
    step: int  # engine step (prefill chunk or decode step) that computed these rows
    request: int  # request index in the scenario
    positions: list[int]  # token positions of the rows, in row order
    tensor: torch.Tensor  # [tokens, features], float32 or wider, on CPU
    rank: int = 0  # tensor-parallel rank that reported it (after gathering: 0)


@dataclass
class RequestOutput:
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float] | None = None  # of the chosen tokens
    text: str | None = None
    finish_reason: str | None = None


@dataclass
class Trace:
    engine: str
    dtype: str
    outputs: list[RequestOutput]
    records: list[TapRecord] = field(default_factory=list)
    meta: dict = field(default_factory=dict)  # options, kernels in use, timings, device

    def taps(self) -> list[str]:
        seen = dict.fromkeys(r.name for r in self.records)
        return list(seen)

    def sequences(self) -> list[list[int]]:
        """Full token sequences (prompt + output) per request, for teacher forcing."""
        return [o.prompt_ids + o.output_ids for o in self.outputs]


RECORD_FIELDS = [f for f in fields(TapRecord) if f.name != "tensor"]  # what trace.json holds of a record


def save(trace: Trace, out_dir: str | Path) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"r{i}": r.tensor.detach().contiguous().cpu() for i, r in enumerate(trace.records)}
    save_file(tensors, str(out / "taps.safetensors"))
    # not asdict(): it deep-copies every record's tensor only for the index to drop it
    index = [{f.name: getattr(r, f.name) for f in RECORD_FIELDS} for r in trace.records]
    doc = {
        "engine": trace.engine,
        "dtype": trace.dtype,
        "meta": trace.meta,
        "outputs": [asdict(o) for o in trace.outputs],
        "records": index,
    }
    (out / "trace.json").write_text(json.dumps(doc))
    return out


def load(out_dir: str | Path, lazy: bool = False) -> Trace:
    """The trace saved in `out_dir`. `lazy`: its records read their tensor from the file on each
    access and keep none, so a caller that takes one tap at a time holds one tap in memory."""
    from safetensors.torch import load_file

    out = Path(out_dir)
    doc = json.loads((out / "trace.json").read_text())
    if lazy and doc["records"]:
        file = TensorFile(out / "taps.safetensors")
        records: list[TapRecord] = [
            LazyTapRecord(file, i, **{**r, "name": sys.intern(r["name"])}) for i, r in enumerate(doc["records"])
        ]
    else:
        tensors = load_file(str(out / "taps.safetensors")) if doc["records"] else {}
        records = [TapRecord(tensor=tensors[f"r{i}"], **r) for i, r in enumerate(doc["records"])]
    return Trace(
        engine=doc["engine"],
        dtype=doc["dtype"],
        meta=doc["meta"],
        outputs=[RequestOutput(**o) for o in doc["outputs"]],
        records=records,
    )


# safetensors dtype names -> torch dtypes (the ones a trace holds: activations, token ids, masks)
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class TensorFile:
    """One tensor at a time out of a .safetensors file, by plain reads. Not `safe_open`: it maps the
    file, and every page a read touches stays resident in the process, so reading all taps one by
    one would still end with the whole file in its RSS. Tensors are named by number (`r{i}`, as
    `save` writes them); what is kept per tensor is compact, as a deep trace has tens of thousands."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        count = len(header) - ("__metadata__" in header)
        layouts: dict[tuple, tuple] = {}  # (dtype, shape), one object per distinct layout
        self.layout: list[tuple] = []
        self.spans = array("q")  # first and end byte of tensor i at [2i], [2i + 1]
        for i in range(count):
            entry = header[f"r{i}"]
            key = (SAFETENSORS_DTYPES[entry["dtype"]], tuple(entry["shape"]))
            self.layout.append(layouts.setdefault(key, key))
            self.spans.extend(8 + size + offset for offset in entry["data_offsets"])

    def get(self, i: int) -> torch.Tensor:
        (dtype, shape), begin, end = self.layout[i], self.spans[2 * i], self.spans[2 * i + 1]
        with open(self.path, "rb") as f:
            f.seek(begin)
            raw = bytearray(f.read(end - begin))
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        return flat.reshape(shape)


class LazyTapRecord(TapRecord):
    """A TapRecord whose tensor stays in its trace file until asked for (read anew on each access)."""

    __slots__ = ("file", "number")

    def __init__(self, file: TensorFile, number: int, name: str, step: int, request: int, positions, rank: int = 0):
        self.file, self.number = file, number
        self.name, self.step, self.request, self.positions, self.rank = name, step, request, positions, rank

    @property
    def tensor(self) -> torch.Tensor:
        return self.file.get(self.number)


def release_freed_memory() -> None:
    """Hand the C heap's free memory back to the system (glibc; elsewhere nothing). Comparing tap after
    tap frees every tap's tensors, but the small summaries kept in between pin the heap, so without
    this the freed memory stays resident and the peak grows with the number of taps compared."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc():
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC = _glibc()
