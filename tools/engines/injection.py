"""Tensor replacement inside an engine run (issue 13): reference rows injected at a tap.

The rows travel to the worker as a trace directory (tools.probe.trace) named by `RunJob.replace`;
every row in it is injected at its tap, matched by request and token position (as
tools/probe/align.py matches rows) and cast to the dtype the target computes in. An adapter
calls `Injection.apply` from the hook that reads the tap, and records what it returns,
so the injected tap reads back the reference's values.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tools.probe import trace as trace_io
from tools.probe.trace import Trace


class Injection:
    def __init__(self, trace: Trace):
        self.rows: dict[str, dict[tuple[int, int], torch.Tensor]] = {}
        for block in trace.blocks():
            slot, tensor = self.rows.setdefault(block.name, {}), block.tensor
            for i, pos in enumerate(block.positions.tolist()):
                slot[(block.request, pos)] = tensor[i]
        self.replaced = {tap: 0 for tap in self.rows}  # rows actually replaced, per tap

    @classmethod
    def load(cls, path: str | Path | None) -> Injection | None:
        return cls(trace_io.load(path)) if path else None

    def wants(self, tap: str) -> bool:
        return tap in self.rows

    def apply(self, tap: str, x: torch.Tensor, requests: list[int], positions: list[int]) -> torch.Tensor:
        """x [N, ...] with row n computed for (requests[n], positions[n]) -> x with reference rows in."""
        slot = self.rows.get(tap, {})
        picks = {n: slot[(r, p)] for n, (r, p) in enumerate(zip(requests, positions)) if (r, p) in slot}
        if not picks:
            return x
        self.replaced[tap] += len(picks)
        return splice_rows(x, picks)


def splice_rows(x: torch.Tensor, values: dict[int, torch.Tensor]) -> torch.Tensor:
    """x [N, ...], {row: [F]} -> a copy of x with those rows replaced (cast to x's dtype)."""
    flat = x.detach().reshape(x.shape[0], -1).clone()
    rows = sorted(values)
    new = torch.stack([values[n].reshape(-1) for n in rows]).to(device=x.device, dtype=x.dtype)
    if new.shape[1] != flat.shape[1]:
        raise ValueError(f"injected rows have {new.shape[1]} features, the target computes {flat.shape[1]}")
    flat[rows] = new
    return flat.reshape(x.shape)
