"""Baselines, scored by the same scorer as the full pipeline (DESIGN §6).

* output-only: final outputs compared (logits and sampler, no internal taps); candidates
  ranked from the source alone, by how well a function's name and file match the issue text.
* bisect-only: bisection with the output-level probe as oracle; functions in the culprit's
  diff ranked by size of change. Without a good ref it has nothing to bisect and falls back
  to the output-only ranking.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

from agent.config import RunConfig
from benchmark.cases import CaseInput
from tools.history.culprit import find_culprit
from tools.hypotheses.evidence import Reproduction
from tools.probe.prober import Prober
from tools.source.index import open_index

OUTPUT_TAPS = ["logits", "sampler.*"]
STOP = {
    "the",
    "a",
    "an",
    "and",
    "or",
    "of",
    "to",
    "in",
    "is",
    "it",
    "with",
    "on",
    "for",
    "this",
    "that",
    "i",
    "we",
    "be",
    "are",
    "was",
    "when",
    "not",
    "but",
    "same",
    "get",
    "self",
    "init",
    "forward",
}


def words(text: str) -> list[str]:
    """Split prose and identifiers into lowercase words (snake_case and CamelCase aware)."""
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return [w for w in re.findall(r"[a-z][a-z0-9]+", text.lower()) if w not in STOP and len(w) > 2]


def rank_by_text(index, issue: str, top: int = 5) -> list[tuple[float, object]]:
    """Functions ranked by overlap between their name/file words and the issue's words."""
    issue_words = Counter(words(issue))
    scored = []
    for sym in index.symbols:
        if sym.kind == "class" or "/test" in f"/{sym.file}":
            continue
        sym_words = set(words(f"{sym.file} {sym.qualname}"))
        score = sum(min(issue_words[w], 3) for w in sym_words)
        if score:
            scored.append((score / (1 + 0.1 * len(sym_words)), sym))
    scored.sort(key=lambda p: (-p[0], p[1].file, p[1].qualname))
    return scored[:top]


def _report(
    case: CaseInput, reproduced: bool, first, hyps: list[dict], prober: Prober, start: float, commit: dict | None = None
) -> dict:
    return {
        "issue": str(case.issue_number),
        "reproduced": reproduced,
        "first_divergence": first,
        "kernel": None,
        "commit": commit,
        "hypotheses": hyps[:5],
        "cost": {
            "engine_runs": prober.engine_runs,
            "llm_calls": 0,
            "tokens_in": 0,
            "tokens_out": 0,
            "wall_s": round(time.monotonic() - start, 2),
        },
    }


def _hyp(rank: int, sym, why: str, commit: str | None = None) -> dict:
    return {
        "rank": rank,
        "file": sym.file,
        "function": sym.qualname,
        "commit": commit,
        "category": "",
        "confidence": round(1.0 / (rank + 1), 3),
        "verified": False,
        "explanation": why,
        "evidence": [why],
        "suggested_fix": "",
        "component": Path(sym.file).stem,
    }


def make_prober(config: RunConfig | None) -> Prober:
    config = config or RunConfig()
    return Prober(timeout=config.engine_timeout_s, device=config.device)


def output_only(case: CaseInput, out_dir: Path, config: RunConfig | None = None) -> dict:
    start, prober = time.monotonic(), make_prober(config)
    result = prober.probe(case.scenario, case.repo, taps=OUTPUT_TAPS)
    index = open_index(case.repo, include_tests=False)
    hyps = [
        _hyp(i + 1, sym, f"name matches the issue text (score {score:.2f})")
        for i, (score, sym) in enumerate(rank_by_text(index, case.issue))
    ]
    first = result.first.to_dict() if result.first else None
    return _report(case, result.diverged, first, hyps, prober, start)


def bisect_only(case: CaseInput, out_dir: Path, config: RunConfig | None = None) -> dict:
    start, prober = time.monotonic(), make_prober(config)
    result = prober.probe(case.scenario, case.repo, taps=OUTPUT_TAPS)
    repro = Reproduction(result.diverged, case.scenario, result)
    culprit = find_culprit(case.repo, case.scenario.good_ref, repro, prober) if result.diverged else None
    if culprit is None:
        report = output_only(case, out_dir, config)
        report["cost"]["engine_runs"] += prober.engine_runs
        return report
    index = open_index(case.repo, include_tests=False)
    sizes = Counter()
    syms = {}
    for change in index.symbols_for_hunks(culprit.diff):
        if change.symbol is not None and change.symbol.kind != "class":
            key = (change.symbol.file, change.symbol.qualname)
            sizes[key] += len(change.lines)
            syms[key] = change.symbol
    ranked = sorted(sizes, key=lambda k: (-sizes[k], k))
    hyps = [
        _hyp(i + 1, syms[k], f"changed {sizes[k]} lines in culprit {culprit.sha[:10]}", culprit.sha)
        for i, k in enumerate(ranked)
    ]
    first = result.first.to_dict() if result.first else None
    return _report(case, True, first, hyps, prober, start, {"sha": culprit.sha, "subject": culprit.subject})
