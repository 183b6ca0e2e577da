"""Traces: what one engine run produced (tap rows + outputs), and their files.

An adapter builds a trace from records: one per tap, request and engine step. Saved and loaded, a
trace holds blocks instead: one per tap and request, the rows of all its records concatenated in
record order. A deep model's decode makes a record per layer, tap, request and token (117k for
SmolLM2-135M generating 2 x 128 tokens); with a tensor per record, saving, loading and regrouping
cost per record, with a tensor per block they cost per tap.

On disk (format 2), a trace is two files in its folder, so it can cross a process boundary and be
read back one block at a time:

- `trace.json`: `{"format": 2, "engine", "dtype", "meta", "outputs": [RequestOutput...],
  "blocks": [{"name", "request", "rank"}, ...]}`;
- `taps.safetensors`, per block i: `b{i}` `[rows, features]` its rows; `b{i}.positions` `[rows]`
  int64, the token position of each row; `b{i}.records` `[records, 3]` int64, one line per record
  in row order: (its number in the trace's record order, its step, its number of rows).

Format 1 (no `format` key: a tensor `r{i}` per record, each record's fields in `records`) is still
read, whole.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import shutil
import struct
import sys
import weakref
from array import array
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = 2
BLOCK_TENSORS = ("", ".positions", ".records")  # the tensors of block i: b{i}, b{i}.positions, b{i}.records


@dataclass(slots=True)  # no __dict__: a trace of a deep model holds tens of thousands of records
class TapRecord:
    name: str  # canonical tap name (tools.probe.taps)
    step: int  # engine step (prefill chunk or decode step) that computed these rows
    request: int  # request index in the scenario
    positions: list[int]  # token positions of the rows, in row order
    tensor: torch.Tensor  # [tokens, features], in the dtype the engine computed it in (or wider), on CPU
    rank: int = 0  # tensor-parallel rank that reported it (after gathering: 0)


@dataclass(slots=True)
class TapBlock:
    """The rows of one tap for one request (and rank), over every step that computed them, in record
    order; records of one tap and request that differ in rank, dtype or feature shape start a new block."""

    name: str
    request: int
    rank: int
    tensor: torch.Tensor  # [rows, features]
    positions: torch.Tensor  # [rows] int64
    table: torch.Tensor  # [records, 3] int64: (number in the trace, step, rows) of each record, in row order

    def steps(self) -> torch.Tensor:  # [rows] the step of each row
        table = self.table
        return torch.repeat_interleave(table[:, 1], table[:, 2])

    def records(self) -> list[tuple[int, TapRecord]]:
        """Its records back, each with its number in the trace."""
        tensor, positions, start, out = self.tensor, self.positions.tolist(), 0, []
        for number, step, count in self.table.tolist():
            span = slice(start, start + count)
            out.append((number, TapRecord(self.name, step, self.request, positions[span], tensor[span], self.rank)))
            start += count
        return out

    def layouts(self) -> list[tuple[torch.dtype, tuple[int, ...]]]:
        """(dtype, shape) of its tensor, positions and table, as `save` writes them."""
        return [(x.dtype, tuple(x.shape)) for x in (self.tensor, self.positions, self.table)]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.tensor, self.positions, self.table


class RecordsBlock(TapBlock):
    """A block over an adapter's records, before they are saved: its tensors are built on each access."""

    __slots__ = ("members", "layout", "rows")

    def __init__(self, first: TapRecord):
        self.name, self.request, self.rank = first.name, first.request, first.rank
        self.members: list[tuple[int, TapRecord]] = []
        self.layout = (first.rank, first.tensor.dtype, first.tensor.shape[1:])  # what every member shares
        self.rows = 0  # of all its members

    @property
    def tensor(self) -> torch.Tensor:
        rows = [rec.tensor for _, rec in self.members]  # detached and on CPU once, after the concatenation
        return (rows[0] if len(rows) == 1 else torch.cat(rows)).detach().cpu()

    @property
    def positions(self) -> torch.Tensor:
        return torch.tensor([p for _, rec in self.members for p in rec.positions], dtype=torch.int64)

    @property
    def table(self) -> torch.Tensor:
        return torch.tensor([[n, rec.step, len(rec.positions)] for n, rec in self.members], dtype=torch.int64)

    def records(self) -> list[tuple[int, TapRecord]]:
        return list(self.members)

    def layouts(self) -> list[tuple[torch.dtype, tuple[int, ...]]]:
        _, dtype, features = self.layout
        rows = self.rows
        return [(dtype, (rows, *features)), (torch.int64, (rows,)), (torch.int64, (len(self.members), 3))]


class FileBlock(TapBlock):
    """A block whose tensors stay in the trace's file until asked for (read anew on each access)."""

    __slots__ = ("file", "number")

    def __init__(self, file: TensorFile, number: int, name: str, request: int, rank: int):
        self.file, self.number = file, number
        self.name, self.request, self.rank = name, request, rank

    @property
    def tensor(self) -> torch.Tensor:
        return self.file.get(3 * self.number)

    @property
    def positions(self) -> torch.Tensor:
        return self.file.get(3 * self.number + 1)

    @property
    def table(self) -> torch.Tensor:
        return self.file.get(3 * self.number + 2)

    def layouts(self) -> list[tuple[torch.dtype, tuple[int, ...]]]:
        return [self.file.layout[3 * self.number + k] for k in range(3)]

    def held(self) -> TapBlock:
        return TapBlock(self.name, self.request, self.rank, self.tensor, self.positions, self.table)


def group_records(records: list[TapRecord], names: Collection[str] | None = None) -> list[TapBlock]:
    """Records -> blocks (`names`: only these taps'), in the order of their first record; no tensor is copied."""
    blocks: list[TapBlock] = []
    open_blocks: dict[tuple[str, int], RecordsBlock] = {}
    for number, rec in enumerate(records):  # a deep model's trace has ~1e5 records: each lookup done once
        if names is not None and rec.name not in names:
            continue
        tensor, rows = rec.tensor, len(rec.positions)
        shape = tensor.shape
        if shape[0] != rows:
            raise ValueError(f"tap {rec.name} step {rec.step}: {shape[0]} rows, {rows} positions")
        key = (rec.name, rec.request)
        block = open_blocks.get(key)
        if block is None or block.layout != (rec.rank, tensor.dtype, shape[1:]):
            block = open_blocks[key] = RecordsBlock(rec)
            blocks.append(block)
        block.members.append((number, rec))
        block.rows += rows
    return blocks


@dataclass
class RequestOutput:
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float] | None = None  # of the chosen tokens
    text: str | None = None
    finish_reason: str | None = None


class Trace:
    """What one engine run produced: per-request outputs, tap rows, run metadata (options, kernels in
    use, timings, device). Built from `records` (an adapter) or from `blocks` (a loaded trace); either
    way both views can be read, `blocks` being the cheap one to compare from."""

    def __init__(
        self,
        engine: str,
        dtype: str,
        outputs: list[RequestOutput],
        records: list[TapRecord] | None = None,
        meta: dict | None = None,
        blocks: list[TapBlock] | None = None,
    ):
        if records is not None and blocks is not None:
            raise ValueError("a trace is built from records or from blocks, not both")
        self.engine, self.dtype, self.outputs = engine, dtype, outputs
        self.meta = {} if meta is None else meta
        self._records = [] if records is None and blocks is None else records
        self._blocks = blocks

    def __repr__(self) -> str:
        rows = f"records={len(self._records)}" if self._records is not None else f"blocks={len(self.blocks())}"
        return f"Trace(engine={self.engine!r}, dtype={self.dtype!r}, outputs={len(self.outputs)}, {rows})"

    @property
    def records(self) -> list[TapRecord]:
        """One record per tap, request and step, in the order the adapter gave them (a loaded trace's
        are split back out of its blocks: each access reads them anew)."""
        if self._records is not None:
            return self._records
        numbered = [pair for block in self._blocks or () for pair in block.records()]
        return [rec for _, rec in sorted(numbered, key=lambda pair: pair[0])]

    def blocks(self, names: Collection[str] | None = None) -> list[TapBlock]:
        """Its rows per tap and request (`names`: only these taps'), in the order of their first record."""
        if self._records is not None:
            return group_records(self._records, names)
        return [b for b in self._blocks or () if names is None or b.name in names]

    def taps(self) -> list[str]:
        source = self._records if self._records is not None else self._blocks or ()
        return list(dict.fromkeys(r.name for r in source))

    def sequences(self) -> list[list[int]]:
        """Full token sequences (prompt + output) per request, for teacher forcing."""
        return [o.prompt_ids + o.output_ids for o in self.outputs]


def save(trace: Trace, out_dir: str | Path, widest: torch.dtype | None = None) -> Path:
    """`widest`: rows in a wider float dtype are written in this one (tools.probe.compare.stored_precision:
    digits below the compare's noise floor, which no ratio can see, are not worth writing and reading)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    blocks = trace.blocks()
    write_blocks(out / "taps.safetensors", blocks, widest)
    doc = {
        "format": FORMAT,
        "engine": trace.engine,
        "dtype": trace.dtype,
        "meta": trace.meta,
        "outputs": [asdict(o) for o in trace.outputs],
        "blocks": [{"name": b.name, "request": b.request, "rank": b.rank} for b in blocks],
    }
    (out / "trace.json").write_text(json.dumps(doc))
    return out


OUTPUTS = "outputs.json"  # a run's outputs and meta, written before its rows (save_outputs)


def save_outputs(trace: Trace, out_dir: str | Path) -> Path:
    """What a caller may need before the rows are written (the token sequences a reference is teacher-forced
    on, the meta it mirrors): `outputs.json` in `out_dir`, `trace.json` less its blocks, made whole in one
    rename so that a reader polling for it never sees part of it (tools.engines.runner.EngineRun.outputs)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "engine": trace.engine,
        "dtype": trace.dtype,
        "meta": trace.meta,
        "outputs": [asdict(o) for o in trace.outputs],
    }
    part = out / (OUTPUTS + ".part")
    part.write_text(json.dumps(doc))
    os.replace(part, out / OUTPUTS)
    return out / OUTPUTS


def load_outputs(out_dir: str | Path) -> Trace | None:
    """The trace of `save_outputs` in `out_dir`: outputs and meta, no rows; None while it is not written."""
    path = Path(out_dir) / OUTPUTS
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return Trace(doc["engine"], doc["dtype"], _outputs(doc), meta=doc["meta"])


def load(out_dir: str | Path, lazy: bool = False, release: Callable[[], None] | None = None) -> Trace:
    """The trace saved in `out_dir`. `lazy`: its blocks read their tensors from the file on each access
    and keep none, so a caller that takes one tap at a time holds one tap in memory. `release`: called
    once nothing reads the files any more (lazy: when the last block is gone; else before returning)."""
    out = Path(out_dir)
    doc = json.loads((out / "trace.json").read_text())
    if doc.get("format", 1) == 1:
        trace = _load_format_1(out, doc)
    elif doc["format"] == FORMAT:
        in_file = _file_blocks(out / "taps.safetensors", doc.pop("blocks"))
        blocks: list[TapBlock] = list(in_file) if lazy else [b.held() for b in in_file]
        if lazy and blocks and release is not None:  # the blocks hold the file, the trace them
            weakref.finalize(in_file[0].file, _release_in, os.getpid(), release)
            release = None
        trace = Trace(doc["engine"], doc["dtype"], _outputs(doc), meta=doc["meta"], blocks=blocks)
    else:
        raise ValueError(f"{out}: trace format {doc['format']}; this diffdx reads formats 1 and {FORMAT}")
    if release is not None:
        release()
    return trace


def _file_blocks(path: Path, entries: list[dict]) -> list[FileBlock]:
    """trace.json's block entries (emptied) -> the blocks of its tensor file, reading no tensor. What the
    blocks keep (names, the file's index) is made after the parsed entries are dropped: a survivor
    made among them would keep their memory resident (the allocator frees a page only once all of
    it is free), and the load would leave behind memory that grows with the number of layers."""
    names = "\0".join(e["name"] for e in entries)  # copied out as one string, split again below
    keys = array("q", [x for e in entries for x in (e["request"], e["rank"])])
    count = len(entries)
    entries.clear()
    file = TensorFile(path, len(BLOCK_TENSORS) * count)
    return [
        FileBlock(file, i, sys.intern(name), keys[2 * i], keys[2 * i + 1])
        for i, name in enumerate(names.split("\0") if count else [])
    ]


def _release_in(pid: int, release: Callable[[], None]) -> None:
    if os.getpid() == pid:  # a forked child that drops its copy of the trace leaves the parent's files
        release()


def remove_folder(folder: Path) -> Callable[[], None]:
    return lambda: shutil.rmtree(folder, ignore_errors=True)


def _outputs(doc: dict) -> list[RequestOutput]:
    return [RequestOutput(**o) for o in doc["outputs"]]


def _load_format_1(out: Path, doc: dict) -> Trace:
    """A format-1 trace (one tensor per record), read whole."""
    from safetensors.torch import load_file

    tensors = load_file(str(out / "taps.safetensors")) if doc["records"] else {}
    records = [TapRecord(tensor=tensors[f"r{i}"], **r) for i, r in enumerate(doc["records"])]
    return Trace(doc["engine"], doc["dtype"], _outputs(doc), records, doc["meta"])


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
SAFETENSORS_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


def write_blocks(path: Path, blocks: list[TapBlock], widest: torch.dtype | None = None) -> None:
    """Blocks -> one .safetensors file, the header first (from the blocks' layouts), then one block at
    a time: saving a trace built from records holds one block's rows concatenated, not a copy of all.
    `widest`: float rows wider than it are written in it."""
    header: dict[str, dict] = {}
    offset = 0
    for i, block in enumerate(blocks):
        for suffix, (dtype, shape) in zip(BLOCK_TENSORS, block.layouts(), strict=True):
            dtype = narrowed(dtype, widest)
            size = dtype.itemsize * math.prod(shape)
            header[f"b{i}{suffix}"] = {
                "dtype": SAFETENSORS_NAMES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for block in blocks:
            for x in block.tensors():
                x = x.detach().cpu().to(narrowed(x.dtype, widest))
                f.write(x.contiguous().reshape(-1).view(torch.uint8).numpy().data)


def narrowed(dtype: torch.dtype, widest: torch.dtype | None) -> torch.dtype:
    """`dtype`, or `widest` when both are floats and `dtype` is wider."""
    if widest is None or not (dtype.is_floating_point and widest.is_floating_point):
        return dtype
    return widest if dtype.itemsize > widest.itemsize else dtype


class TensorFile:
    """The tensors of a trace's file (`b{i}{suffix}`, tensor 3i + the suffix's index in BLOCK_TENSORS), one
    at a time, each over a mapping of its own bytes that ends with the tensor (`_mapped`; a plain read
    where its bytes are not aligned for its dtype). Not `safe_open`: it maps the whole file for as long
    as the file is open, and every page a read touches stays resident in the process, so reading all taps
    one by one would still end with the whole file in its RSS. What is kept per tensor is compact, and the header is parsed one entry at a time: parsed
    whole, a deep model's header is megabytes of small objects, which the allocator keeps in part."""

    def __init__(self, path: Path, count: int):
        self.path = path
        layouts: dict[tuple, tuple] = {}  # (dtype, shape), one object per distinct layout
        self.layout: list[tuple] = [()] * count
        self.spans = array("q", bytes(16 * count))  # first and end byte of tensor i at [2i], [2i + 1]
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = f.read(size).decode()
        for name, entry in json_object_items(header):
            i = tensor_number(name)
            if i is None or i >= count:
                continue  # `__metadata__`, or a tensor of no block
            key = (SAFETENSORS_DTYPES[entry["dtype"]], tuple(entry["shape"]))
            self.layout[i] = layouts.setdefault(key, key)
            self.spans[2 * i], self.spans[2 * i + 1] = (8 + size + offset for offset in entry["data_offsets"])
        if () in self.layout:
            raise ValueError(f"{path}: tensor {self.layout.index(())} of {count} is missing")

    def get(self, i: int) -> torch.Tensor:
        (dtype, shape), begin, end = self.layout[i], self.spans[2 * i], self.spans[2 * i + 1]
        start = begin - begin % mmap.ALLOCATIONGRANULARITY
        if end > begin and (begin - start) % dtype.itemsize == 0:
            return self._mapped(i, start, begin, end).view(dtype).reshape(shape)
        raw = torch.empty(end - begin, dtype=torch.uint8)
        with open(self.path, "rb") as f:
            f.seek(begin)
            got = f.readinto(raw.numpy())  # straight into the tensor's memory: one copy, not two
        if got != end - begin:
            raise ValueError(f"{self.path}: tensor {i} ends past the file ({got} of {end - begin} bytes)")
        _heap.read += end - begin
        return raw.view(dtype).reshape(shape)

    def _mapped(self, i: int, start: int, begin: int, end: int) -> torch.Tensor:
        """Bytes begin..end of the file as a tensor over a private mapping of them, unmapped when the tensor
        is freed: the file's cached pages are mapped, not copied into fresh memory (which the heap trims
        between taps hand back, so a read faulted in and zeroed every page before copying into it)."""
        with open(self.path, "rb") as f:
            try:
                mapped = mmap.mmap(f.fileno(), end - start, offset=start, access=mmap.ACCESS_COPY)
            except ValueError:  # shorter than its header says
                raise ValueError(f"{self.path}: tensor {i} ends past the file") from None
        return torch.frombuffer(mapped, dtype=torch.uint8, count=end - begin, offset=begin - start)


def tensor_number(name: str) -> int | None:
    """'b12.positions' -> 37 (3 * 12 + 1): where a block tensor is in a trace file's order; else None."""
    head, dot, suffix = name.partition(".")
    k = BLOCK_TENSORS.index(dot + suffix) if dot + suffix in BLOCK_TENSORS else -1
    if k < 0 or head[:1] != "b" or not head[1:].isdigit():
        return None
    return len(BLOCK_TENSORS) * int(head[1:]) + k


def json_object_items(text: str) -> Iterator[tuple[str, Any]]:
    """The text of a JSON object -> its (key, value) pairs, each parsed when reached."""
    decoder, i = json.JSONDecoder(), _skip_space(text, 0)
    if text[i : i + 1] != "{":
        raise ValueError("not a JSON object")
    i = _skip_space(text, i + 1)
    while text[i : i + 1] != "}":
        key, i = decoder.raw_decode(text, i)
        i = _skip_space(text, i)
        if text[i : i + 1] != ":":
            raise ValueError(f"JSON object: ':' expected at {i}")
        value, i = decoder.raw_decode(text, _skip_space(text, i + 1))
        yield key, value
        i = _skip_space(text, i)
        if text[i : i + 1] == ",":
            i = _skip_space(text, i + 1)
        elif text[i : i + 1] != "}":
            raise ValueError(f"JSON object: ',' or '}}' expected at {i}")


def _skip_space(text: str, i: int) -> int:
    while text[i : i + 1] in (" ", "\t", "\n", "\r"):  # past the end: ""
        i += 1
    return i


class _HeapReads:
    """Bytes of tensors read from trace files since the heap was last trimmed."""

    read = 0


_heap = _HeapReads()
TRIM_AFTER_BYTES = 32 << 20  # a trim costs ~10 ms: one per tap of a deep model (900 taps) was seconds


def release_freed_memory() -> None:
    """Hand the C heap's free memory back to the system (glibc; elsewhere nothing) once at least
    TRIM_AFTER_BYTES of tensors were read since the last time. Comparing tap after tap frees every
    tap's tensors, but the small summaries kept in between pin the heap, so without this the freed
    memory stays resident and the peak grows with the number of taps compared; with it the peak
    exceeds one tap's by at most that much, whatever the number of taps."""
    if _LIBC is not None and _heap.read >= TRIM_AFTER_BYTES:
        _LIBC.malloc_trim(0)
        _heap.read = 0


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
