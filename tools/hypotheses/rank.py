"""Candidates -> hypotheses: category, fix hint, confidence; verified first, then by score."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tools.hypotheses.evidence import DrillDown, Hypothesis, Reproduction
from tools.source.index import Symbol

# Scores per kind of evidence (plain data; tuned on nothing but their order of strength).
WEIGHTS = {
    "culprit": 6.0,
    "modified": 0.5,
    "kernel": 3.0,
    "kernel_helper": 1.5,  # called by the function computing the first wrong op (drill-down op checks)
    "spectrum": 2.5,
    "component": 1.5,
    "trigger": 1.5,
    "recent": 1.0,
    "ran": 1.0,
    "not_run": -4.0,
    "coverage_unknown": 0.0,  # C/C++ next to recorded Python: neither ran nor not run
    "native_twin": -2.0,
    "verified": 20.0,
    "refuted": -3.0,
    "contract": 10.0,  # breaks its own contract on its recorded inputs (tools.hypotheses.contracts)
    "contract_caller": 1.0,  # breaks it only where a callee that breaks it too is involved
    "contract_ok": -1.5,
    "feeds": 10.0,  # hands a function of a known role inputs that contradict each other (probs vs logits)  # keeps its contract on every recorded call
    "setting": 3.0,  # named after a setting given to functions that keep their contracts where it diverges
}

CATEGORY_OF_COMPONENT = {
    "rotary": "positional-encoding",
    "attention": "attention",
    "sampler": "sampling",
    "norm": "numerics",
    "residual": "numerics",
    "activation": "numerics",
    "linear": "model-config",
    "embedding": "model-config",
    "lm_head": "model-config",
}


@dataclass
class Candidate:
    symbol: Symbol
    score: float = 0.0
    evidence: list[str] = field(default_factory=list)
    commit: str | None = None  # the commit whose change to it is suspected
    kinds: set[str] = field(default_factory=set)

    def add(self, kind: str, line: str, weight: float | None = None) -> None:
        if kind in self.kinds:
            return
        self.kinds.add(kind)
        self.score += WEIGHTS[kind] if weight is None else weight
        if line:
            self.evidence.append(line)


def to_hypothesis(c: Candidate, drill: DrillDown, repro: Reproduction) -> Hypothesis:
    category = category_for(c, drill, repro)
    why = "; ".join(c.evidence[:3])
    return Hypothesis(
        file=c.symbol.file,
        function=c.symbol.qualname,
        commit=c.commit,
        category=category,
        confidence=0.0,
        explanation=f"{c.symbol.qualname} is suspected: {why}.",
        evidence=list(c.evidence),
        suggested_fix=fix_hint(c, drill),
        component=Path(c.symbol.file).stem,
        score=c.score,
    )


def category_for(c: Candidate, drill: DrillDown, repro: Reproduction) -> str:
    text = f"{c.symbol.file} {c.symbol.qualname}".lower()
    if drill.kernel and "kernel" in c.kinds:
        return "kernel"
    if repro.precision == "precision":
        return "numerics"
    for words, cat in (
        (["block", "prefix", "kv_cache", "slot", "evict"], "kv-cache"),
        (["schedul", "batch"], "batching"),
        (["sampl", "penalt"], "sampling"),
        (["rotary", "rope"], "positional-encoding"),
        (["load", "config"], "model-config"),
        (["token"], "tokenizer"),
        (["attention", "attn"], "attention"),
    ):
        if any(w in text for w in words):
            return cat
    return CATEGORY_OF_COMPONENT.get(drill.component, "numerics")


def fix_hint(c: Candidate, drill: DrillDown) -> str:
    if "culprit" in c.kinds:
        return f"review and revert the culprit commit's change to {c.symbol.qualname}"
    if "kernel" in c.kinds and drill.op is not None:
        return f"check {c.symbol.qualname} against op {drill.op['op']} computed in fp64 on the same inputs"
    if "kernel" in c.kinds:
        return f"compare {c.symbol.qualname} with the native twin of {drill.kernel}; fall back to native until fixed"
    return f"check {c.symbol.qualname} against the reference's {drill.component} at {drill.tap}"


def rank(cands: list[Hypothesis], top: int = 5) -> list[Hypothesis]:
    """Verified first, then by score; confidences from the scores."""
    ordered = sorted(cands, key=lambda h: (not h.verified, -h.score, h.file, h.function))[:top]
    total = sum(max(h.score, 0.1) for h in ordered) or 1.0
    for h in ordered:
        h.confidence = 0.95 if h.verified else round(min(0.9, max(h.score, 0.1) / total), 3)
    return ordered
