"""The order in which a benchmark run hands its cases to the workers: the costliest first.

With N workers the run's wall is at least max(total / N, the longest case), and it reaches that
bound only when no long case starts last: a 10-minute case picked up at minute 50 keeps one
worker busy after the other has finished. So cases are sorted by an estimate of their cost,
highest first (ties keep the given order). The estimate never knows an answer: it is the CPU
seconds a previous results file measured for the case (`--costs-from`), else a prior by what the
diagnosis's own input shows: the subject, the track (a release history to install, a history to
bisect, none) and whether the repro compiles the model (torch.compile traces every engine run).
The order changes no diagnosis; scoring and the tables keep the cases' own order.
"""

from __future__ import annotations

import json
import tomllib
from functools import cache
from pathlib import Path

from benchmark.cases import Case

PRIOR_FILE = Path(__file__).parent / "subjects" / "cost_prior.toml"  # per subject and track (data, not code)


@cache
def cost_prior(path: Path = PRIOR_FILE) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def prior_cpu_s(case: Case, prior: dict | None = None) -> float:
    """A case's estimated CPU seconds from its subject, track and repro alone (subjects/cost_prior.toml)."""
    prior = cost_prior() if prior is None else prior
    if case.scenario.target.options.get("compile"):
        return float(prior["compile"])
    return float((prior.get(case.subject) or {}).get(case.track, prior["default"]))


def previous_costs(path: Path) -> dict[str, float]:
    """A results.json of an earlier run -> case id -> its CPU seconds (its wall seconds when the file
    predates cost.cpu_s: the order is what matters, and wall is monotone enough in it)."""
    cases = json.loads(Path(path).read_text()).get("cases") or []
    costs = {}
    for c in cases:
        value = c.get("cpu_s") or c.get("wall_s")
        if isinstance(value, (int, float)) and value > 0:
            costs[str(c["case"])] = float(value)
    return costs


def costliest_first(cases: list[Case], previous: dict[str, float] | None = None) -> list[Case]:
    """`cases` sorted by estimated cost, highest first; a measured cost beats the prior. Pure."""
    previous = previous or {}
    return sorted(cases, key=lambda c: -previous.get(c.id, prior_cpu_s(c)))
