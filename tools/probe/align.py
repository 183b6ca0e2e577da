"""Align tap records of several traces by (tap, request, position).

Engines schedule work differently (one padded forward vs. chunks and decode
steps), so rows are matched by token position, never by step. The target's
step of each row is kept for reporting ("only decode steps").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tools.probe import taps as tapnames
from tools.probe.trace import Trace

NOT_COMPARED = ("sampler.token",)  # token ids: compared as tokens, not by error ratio


@dataclass
class TapRows:
    positions: list[int]
    steps: list[int]
    tensor: torch.Tensor  # [P, F]


@dataclass
class Aligned:
    tap: str
    request: int
    positions: list[int]
    steps: list[int]  # target step that computed each row
    t: torch.Tensor  # target           [P, F]
    r: torch.Tensor  # reference, target dtype
    y: torch.Tensor  # reference, high precision


class AlignmentError(ValueError):
    pass


def index(trace: Trace) -> dict[tuple[str, int], TapRows]:
    """Trace -> rows per (tap, request), sorted by position; a recomputed position keeps its last value."""
    rows: dict[tuple[str, int], dict[int, tuple[int, torch.Tensor]]] = {}
    for rec in trace.records:
        slot = rows.setdefault((rec.name, rec.request), {})
        for i, pos in enumerate(rec.positions):
            slot[pos] = (rec.step, rec.tensor[i])
    out = {}
    for key, slot in rows.items():
        positions = sorted(slot)
        out[key] = TapRows(positions, [slot[p][0] for p in positions], torch.stack([slot[p][1] for p in positions]))
    return out


def align(target: Trace, reference: Trace, high: Trace) -> list[Aligned]:
    """Three traces -> aligned rows present in all of them, in tap execution order."""
    t_idx, r_idx, y_idx = index(target), index(reference), index(high)
    aligned = []
    for key in sorted(t_idx, key=lambda k: (tapnames.order_key(k[0]), k[1])):
        if key[0] in NOT_COMPARED or key not in r_idx or key not in y_idx:
            continue
        aligned.append(_common_rows(key, t_idx[key], r_idx[key], y_idx[key]))
    return [a for a in aligned if a.positions]


def _common_rows(key, t: TapRows, r: TapRows, y: TapRows) -> Aligned:
    common = sorted(set(t.positions) & set(r.positions) & set(y.positions))
    pick = lambda rows: rows.tensor[[rows.positions.index(p) for p in common]] if common else rows.tensor[:0]
    tt, rr, yy = pick(t), pick(r), pick(y)
    if common and not (tt.shape == rr.shape == yy.shape):
        raise AlignmentError(
            f"tap {key[0]} request {key[1]}: shapes differ "
            f"(target {tuple(tt.shape)}, reference {tuple(rr.shape)}, high {tuple(yy.shape)})"
        )
    steps = [t.steps[t.positions.index(p)] for p in common]
    return Aligned(key[0], key[1], common, steps, tt, rr, yy)
