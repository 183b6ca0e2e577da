"""Traces: what one engine run produced (tap records + outputs), and their files.

On disk a trace is `taps.safetensors` (one tensor per record) plus `trace.json`
(record index, per-request outputs, run metadata), so it can cross a process
boundary and be reloaded lazily.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch


@dataclass
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


def save(trace: Trace, out_dir: str | Path) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"r{i}": r.tensor.detach().contiguous().cpu() for i, r in enumerate(trace.records)}
    save_file(tensors, str(out / "taps.safetensors"))
    index = [{k: v for k, v in asdict(r).items() if k != "tensor"} for r in trace.records]
    doc = {
        "engine": trace.engine,
        "dtype": trace.dtype,
        "meta": trace.meta,
        "outputs": [asdict(o) for o in trace.outputs],
        "records": index,
    }
    (out / "trace.json").write_text(json.dumps(doc))
    return out


def load(out_dir: str | Path) -> Trace:
    from safetensors.torch import load_file

    out = Path(out_dir)
    doc = json.loads((out / "trace.json").read_text())
    tensors = load_file(str(out / "taps.safetensors")) if doc["records"] else {}
    records = [TapRecord(tensor=tensors[f"r{i}"], **r) for i, r in enumerate(doc["records"])]
    return Trace(
        engine=doc["engine"],
        dtype=doc["dtype"],
        meta=doc["meta"],
        outputs=[RequestOutput(**o) for o in doc["outputs"]],
        records=records,
    )
