"""Align tap rows of several traces by (tap, request, position).

Engines schedule work differently (one padded forward vs. chunks and decode
steps), so rows are matched by token position, never by step. The target's
step of each row is kept for reporting ("only decode steps").
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import torch

from tools.probe import taps as tapnames
from tools.probe.trace import TapBlock, Trace, release_freed_memory

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
    return {key: tap_rows(blocks) for key, blocks in block_groups(trace, names).items()}


def block_groups(trace: Trace, names: Collection[str] | None = None) -> dict[tuple[str, int], list[TapBlock]]:
    """Trace -> its blocks per (tap, request), in record order; no tensor is read."""
    groups: dict[tuple[str, int], list[TapBlock]] = {}
    for block in trace.blocks(names):
        groups.setdefault((block.name, block.request), []).append(block)
    return groups


def tap_rows(blocks: list[TapBlock], with_steps: bool = True) -> TapRows:
    """The blocks of one (tap, request) -> their rows sorted by position, the last row of a position winning.
    Not `with_steps`: its `steps` are left empty (a reference's rows: only the target's steps are reported)."""
    parts = [(b.tensor, b.positions) for b in blocks]  # once per block: a lazy block reads its file
    tensor, positions = (torch.cat(x) if len(parts) > 1 else x[0] for x in zip(*parts, strict=True))
    steps = (torch.cat([b.steps() for b in blocks]) if len(blocks) > 1 else blocks[0].steps()) if with_steps else None
    if bool((positions[1:] > positions[:-1]).all()):  # one row per position, in order (the usual case): no copy
        return TapRows(positions.tolist(), [] if steps is None else steps.tolist(), tensor)
    keep = last_row_per_position(positions)
    return TapRows(positions[keep].tolist(), [] if steps is None else steps[keep].tolist(), tensor[keep])


def last_row_per_position(positions: torch.Tensor) -> torch.Tensor:
    """[N] int64 position of each row -> [P] index of the last row of each distinct position, by position."""
    order = torch.argsort(positions, stable=True)  # equal positions keep their row order
    ordered = positions[order]
    last = torch.ones_like(ordered, dtype=torch.bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    return order[last]


def align(target: Trace, reference: Trace, high: Trace) -> list[Aligned]:
    """Three traces -> aligned rows present in all of them, in tap execution order."""
    return list(iter_aligned(target, reference, high))


def iter_aligned(target: Trace, reference: Trace, high: Trace) -> Iterator[Aligned]:
    """`align`, one (tap, request) at a time: only that tap's rows of the three traces are built, so
    over lazily loaded traces the memory held is one tap's, whatever the number of layers (the blocks
    of each (tap, request) are found by bisection in an array, not held in a dict of lists)."""
    t_blocks, r_blocks, y_blocks = (BlockFinder(trace.blocks()) for trace in (target, reference, high))
    keys = dict.fromkeys((b.name, b.request) for b in t_blocks.blocks)  # in the order of their first block
    for key in sorted(keys, key=lambda k: (tapnames.order_key(k[0]), k[1])):
        r, y = r_blocks.group(key), y_blocks.group(key)
        if key[0] in NOT_COMPARED or not r or not y:
            continue
        release_freed_memory()  # the taps before this one's
        aligned = _common_rows(key, tap_rows(t_blocks.group(key)), tap_rows(r, False), tap_rows(y, False))
        if aligned.positions:
            yield aligned


class BlockFinder:
    """The blocks of a trace by (tap, request): `block_groups`'s answer, kept as one array of block
    numbers sorted by (tap, request), record order within each."""

    def __init__(self, blocks: list[TapBlock]):
        self.blocks = blocks
        self.order = array("q", sorted(range(len(blocks)), key=self.key))

    def key(self, i: int) -> tuple[str, int]:
        return self.blocks[i].name, self.blocks[i].request

    def group(self, key: tuple[str, int]) -> list[TapBlock]:
        """The blocks of (tap, request) `key`, in record order; [] when it has none."""
        out, k = [], bisect_left(self.order, key, key=self.key)
        while k < len(self.order) and self.key(self.order[k]) == key:
            out.append(self.blocks[self.order[k]])
            k += 1
        return out


def _common_rows(key, t: TapRows, r: TapRows, y: TapRows) -> Aligned:
    spans = [s for s in (_span(rows.positions) for rows in (t, r, y)) if s is not None]
    if len(spans) == 3:  # each holds one run of consecutive positions (the usual case): the common run, by slices
        first, last = max(s[0] for s in spans), min(s[1] for s in spans)
        common = list(range(first, last + 1))
        (tt, t_rows), (rr, _), (yy, _) = (_run_at(rows, first, last) for rows in (t, r, y))
    else:
        common = sorted(set(t.positions) & set(r.positions) & set(y.positions))
        (tt, t_rows), (rr, _), (yy, _) = (_rows_at(rows, common) for rows in (t, r, y))
    if common and not (tt.shape == rr.shape == yy.shape):
        raise AlignmentError(
            f"tap {key[0]} request {key[1]}: shapes differ "
            f"(target {tuple(tt.shape)}, reference {tuple(rr.shape)}, high {tuple(yy.shape)})"
        )
    return Aligned(key[0], key[1], common, [t.steps[i] for i in t_rows], tt, rr, yy)


def _span(positions: list[int]) -> tuple[int, int] | None:
    """Sorted distinct positions -> (first, last) when they are every position between the two; else None."""
    if positions and positions[-1] - positions[0] + 1 == len(positions):
        return positions[0], positions[-1]
    return None


def _run_at(rows: TapRows, first: int, last: int) -> tuple[torch.Tensor, list[int]]:
    """`_rows_at` of positions first..last in rows holding one run of consecutive positions: a view."""
    start = first - rows.positions[0]
    picked = list(range(start, start + max(0, last - first + 1)))
    return rows.tensor[start : start + len(picked)], picked


def _rows_at(rows: TapRows, positions: list[int]) -> tuple[torch.Tensor, list[int]]:
    """rows, sorted positions they all hold -> ([len(positions), F] their rows there, the row indices)."""
    row_of = {p: i for i, p in enumerate(rows.positions)}
    picked = [row_of[p] for p in positions]
    if not picked:
        return rows.tensor[:0], picked
    if picked[-1] - picked[0] + 1 == len(picked):  # consecutive rows (sorted and distinct): a view, no copy
        return rows.tensor[picked[0] : picked[-1] + 1], picked
    return rows.tensor[picked], picked
