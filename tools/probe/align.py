"""Align tap records of several traces by (tap, request, position).

Engines schedule work differently (one padded forward vs. chunks and decode
steps), so rows are matched by token position, never by step. The target's
step of each row is kept for reporting ("only decode steps").
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

import torch

from tools.probe import taps as tapnames
from tools.probe.trace import TapRecord, Trace, release_freed_memory

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


def index(trace: Trace, names: Collection[str] | None = None) -> dict[tuple[str, int], TapRows]:
    """Trace -> rows per (tap, request), sorted by position; a recomputed position keeps its last value.
    `names`: only these taps (a lazily loaded trace then reads no other tap's tensors)."""
    return {key: tap_rows(records) for key, records in record_groups(trace, names).items()}


def record_groups(trace: Trace, names: Collection[str] | None = None) -> dict[tuple[str, int], list[TapRecord]]:
    """Trace -> its records per (tap, request), in record order; no tensor is read."""
    groups: dict[tuple[str, int], list[TapRecord]] = {}
    for rec in trace.records:
        if names is None or rec.name in names:
            groups.setdefault((rec.name, rec.request), []).append(rec)
    return groups


def tap_rows(records: list[TapRecord]) -> TapRows:
    """The records of one (tap, request) -> their rows sorted by position, the last record of a position winning."""
    slot: dict[int, tuple[int, torch.Tensor]] = {}
    for rec in records:
        tensor = rec.tensor  # once per record: a lazy record reads its file on every access
        for i, pos in enumerate(rec.positions):
            slot[pos] = (rec.step, tensor[i])
    positions = sorted(slot)
    return TapRows(positions, [slot[p][0] for p in positions], torch.stack([slot[p][1] for p in positions]))


def align(target: Trace, reference: Trace, high: Trace) -> list[Aligned]:
    """Three traces -> aligned rows present in all of them, in tap execution order."""
    return list(iter_aligned(target, reference, high))


def iter_aligned(target: Trace, reference: Trace, high: Trace) -> Iterator[Aligned]:
    """`align`, one (tap, request) at a time: only that tap's rows of the three traces are built, so
    over lazily loaded traces the memory held is one tap's, whatever the number of layers."""
    t_groups, r_groups, y_groups = record_groups(target), record_groups(reference), record_groups(high)
    for key in sorted(t_groups, key=lambda k: (tapnames.order_key(k[0]), k[1])):
        if key[0] in NOT_COMPARED or key not in r_groups or key not in y_groups:
            continue
        release_freed_memory()  # the taps before this one's
        aligned = _common_rows(key, tap_rows(t_groups[key]), tap_rows(r_groups[key]), tap_rows(y_groups[key]))
        if aligned.positions:
            yield aligned


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
