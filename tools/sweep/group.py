"""Divergent cells -> groups (one suspected bug each) -> the smallest scenario that still diverges.

Cells that first part from the reference at the same tap (any layer) under the same feature set
are taken for one bug, whatever their workload; when the tap also diverges with no feature on,
the feature is not the trigger and its cells join that group (likewise "all" joins the one single
feature that diverges there). A group is diagnosed once, from its smallest member, reduced further
by `minimize` (drop options, requests, generated tokens while it still diverges).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tools.scenario import Scenario
from tools.sweep.matrix import Cell

_LAYER = re.compile(r"\.\d+\.")
DTYPE_RANK = {"float32": 0, "bfloat16": 1, "float16": 2}  # fp32 first: the least noise to reason about


@dataclass
class CellResult:
    cell: Cell
    status: str  # "agree" | "diverge" | "error" | "skipped"
    seconds: float = 0.0
    summary: str = ""
    first_tap: str | None = None  # canonical tap of the first divergence ("tokens"/"text" if no tap)
    ratio: float | None = None
    engine_runs: int = 0
    detail: str = ""  # error message or the probe's table
    draws: dict | None = None  # the drawn tokens' uniformity test (prober.draws_dict); None: no sampled request


@dataclass
class Group:
    key: tuple[str, str]  # (tap with any layer, the feature set that triggers it)
    cells: list[CellResult] = field(default_factory=list)

    @property
    def id(self) -> str:
        tap, features = self.key
        return f"{tap.replace('*', 'N')}--{features}"

    @property
    def workloads(self) -> list[str]:
        return sorted({r.cell.workload for r in self.cells})

    def representative(self) -> CellResult:
        """The member to minimize and diagnose: fp32 before half precision, then the first arch."""
        return min(self.cells, key=lambda r: (DTYPE_RANK.get(r.cell.dtype, 9), r.cell.arch))


def any_layer(tap: str) -> str:
    """'layers.1.attn.out' -> 'layers.*.attn.out': the same fault shows first in different layers."""
    return _LAYER.sub(".*.", tap, count=1)


def group_cells(results: list[CellResult]) -> list[Group]:
    groups: dict[tuple[str, str], Group] = {}
    for r in results:
        if r.status == "diverge":
            key = (any_layer(r.first_tap or "tokens"), r.cell.features)
            groups.setdefault(key, Group(key)).cells.append(r)
    for tap in {tap for tap, _ in groups}:
        target = _trigger_group(groups, tap)
        if target is None:
            continue
        for key in [k for k in groups if k[0] == tap and k != target.key and _folds(k[1], target.key[1])]:
            target.cells += groups.pop(key).cells
    return sorted(groups.values(), key=lambda g: (-len(g.cells), g.key))


def _trigger_group(groups: dict[tuple[str, str], Group], tap: str) -> Group | None:
    """The group at `tap` the others fold into: no feature on, else the only single feature."""
    if (tap, "none") in groups:
        return groups[(tap, "none")]
    single = [g for (t, f), g in groups.items() if t == tap and f != "all"]
    return single[0] if len(single) == 1 else None


def _folds(features: str, into: str) -> bool:
    return into == "none" or features == "all"


def reductions(sc: Scenario, keep_options: frozenset[str] = frozenset()) -> list[tuple[str, Scenario]]:
    """Smaller variants of a scenario, most shrinking first: one engine option dropped, one request
    dropped (requests after it arrive one step earlier), half the generated tokens."""
    out = []
    for key in sorted(set(sc.target.options) - keep_options):
        opts = {k: v for k, v in sc.target.options.items() if k != key}
        out.append((f"without option {key}", replace(sc, target=replace(sc.target, options=opts))))
    reqs = list(sc.requests)
    if len(reqs) > 1:
        for i in range(len(reqs)):
            rest = reqs[:i] + reqs[i + 1 :]
            out.append((f"without request {i}", replace(sc, requests=tuple(rest))))
    longest = max(r.max_tokens for r in reqs)
    if longest > 2:
        half = tuple(replace(r, max_tokens=max(2, r.max_tokens // 2)) for r in reqs)
        out.append((f"max_tokens halved (longest {longest} -> {max(2, longest // 2)})", replace(sc, requests=half)))
    return out


def minimize(
    sc: Scenario, diverges: Callable[[Scenario], bool], budget: int, keep_options: frozenset[str] = frozenset()
) -> tuple[Scenario, list[str], int]:
    """Greedy reduction: take the first smaller variant that still diverges, repeat until none does
    or `budget` probes are spent. Returns the scenario, the steps taken, and the probes used."""
    steps: list[str] = []
    used = 0
    progress = True
    while progress and used < budget:
        progress = False
        for description, smaller in reductions(sc, keep_options):
            if used >= budget:
                break
            used += 1
            if diverges(smaller):
                sc, progress = smaller, True
                steps.append(description)
                break
    return sc, steps, used
