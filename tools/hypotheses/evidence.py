"""What each diagnosis stage hands to the next (data only; the stages live in their own modules).

issue -> Scenario -> Reproduction -> DrillDown -> Culprit -> candidates -> Hypothesis list -> report
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tools.hypotheses.categories import CATEGORIES as CATEGORIES  # re-exported
from tools.probe.prober import ProbeResult
from tools.scenario import Scenario


@dataclass
class Trial:
    """One scenario variant tried while searching for a trigger."""

    description: str  # e.g. "batch of 2, prefix caching on"
    diverged: bool
    summary: str
    engine_runs: int = 0
    off_issue: str | None = None  # it diverged, but not as the issue describes: why (tools.reproduce.off_issue)
    dtype: str = ""


@dataclass
class SideFinding:
    """A divergence the trigger search found that the issue does not describe."""

    trigger: str  # the variant that diverged
    why: str  # what the issue does not describe
    summary: str  # the probe's one-line verdict
    first_divergence: dict | None = None


@dataclass
class Reproduction:
    reproduced: bool
    scenario: Scenario  # the (smallest) scenario that reproduces, or the original
    probe: ProbeResult | None
    trials: list[Trial] = field(default_factory=list)
    trigger: str | None = None  # what had to change to reproduce ("" = as given)
    precision: str | None = None  # "logic" (persists in fp32) | "precision" (vanishes) | None
    error: str | None = None  # why nothing could be run, if so
    baseline: Scenario | None = None  # a nearby scenario where the engines agree (spectrum evidence)
    # `reproduced` says the engines diverge on `scenario`; `on_issue` whether that divergence is the
    # reported one (as given, or a trigger the issue describes) or a side finding diagnosed instead
    on_issue: bool = True
    side_findings: list[SideFinding] = field(default_factory=list)


@dataclass
class DrillDown:
    tap: str  # first divergent tap
    layer: int | None
    component: str  # tools.probe.taps.component(tap): attention, rotary, norm, sampler…
    kernel: str | None = None  # swappable kernel whose native twin removes the divergence, or the first wrong op
    # the first op that computes wrong from its own inputs (RunJob.op_checks): op, name, ratio, file, function
    op: dict | None = None
    pattern: dict = field(default_factory=dict)  # requests / positions / steps / decode-only / … clues
    evidence: list[str] = field(default_factory=list)
    engine_runs: int = 0


@dataclass
class Culprit:
    sha: str
    subject: str
    message: str
    diff: str
    tested: list[tuple[str, str]] = field(default_factory=list)  # (sha, verdict)
    ambiguous: list[str] = field(default_factory=list)  # candidate shas when skips blur it
    engine_runs: int = 0


# Kinds of evidence that verify a hypothesis (report.json `verified_by`).
VERIFIED_BY = ("restore", "fix-template", "llm-patch", "tensor-replacement", "native-twin")


@dataclass
class Hypothesis:
    file: str
    function: str
    commit: str | None
    category: str
    confidence: float
    explanation: str
    evidence: list[str] = field(default_factory=list)
    suggested_fix: str = ""
    verified: bool = False
    component: str = ""
    score: float = 0.0
    # which evidence verified it: VERIFIED_BY, or None; and the edit that did, for a fix or patch
    verified_by: str | None = None
    verifying_diff: str = ""

    def to_dict(self, rank: int) -> dict:
        d = asdict(self)
        d.pop("score")
        return {"rank": rank, **d}
