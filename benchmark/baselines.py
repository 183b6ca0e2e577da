"""Baselines, scored by the same scorer as the full pipeline (DESIGN §6).

* output-only: final outputs compared (logits and sampler, no internal taps); candidates
  ranked from the source alone, by how well a function's name and file match the issue text.
* bisect-only: bisection with the output-level probe as oracle; functions in the culprit's
  diff ranked by size of change. Without a good ref it has nothing to bisect and falls back
  to the output-only ranking.
* revert-recent: every function changed by the last N commits (N = 12; `revert-recent-all`:
  every commit since the `base` tag) that ran in the failing scenario (function coverage) is
  restored to its version before the window and the output-level probe re-run; functions whose
  restore removed the divergence rank first, then by recency of their last change. Functions
  coverage cannot see (a C/C++ tree, or C/C++ next to Python) are restored too, newest first, at
  most 12 of them (each restore rebuilds a native tree); a restore that would change only
  comments is not run (its outcome is HEAD's). No taps,
  no bisection, no drill-down. It uses the scenario as reported (no trigger search), as the
  full pipeline does when the scenario reproduces.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

from agent.config import RunConfig
from benchmark.cases import CaseInput
from tools.engines.runner import EngineRunError
from tools.history.culprit import find_culprit
from tools.history.gitrepo import _LOG_FORMAT, GitError, _git, _parse_log, commit_diff, temporary_worktree
from tools.hypotheses.coverage import Coverage, ran
from tools.hypotheses.evidence import Reproduction
from tools.hypotheses.verify import restore_version
from tools.probe.prober import Prober
from tools.source.index import commit_changes, open_index, same_code

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
    for change in commit_changes(case.repo, culprit.sha, culprit.diff, index):
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


RECENT_COMMITS = 12


def recent_commits(repo: Path, last: int | None) -> list:
    """The last `last` commits of HEAD's first-parent chain (None: all since the `base` tag), newest first."""
    # a root commit is the snapshot itself, not a change: it never counts as a recent commit
    span = ["-n", str(last), "--min-parents=1", "HEAD"] if last else ["base..HEAD"]
    return _parse_log(_git(repo, "log", "--first-parent", f"--format={_LOG_FORMAT}", *span))


def changed_functions(repo: Path, index, commits: list) -> dict[tuple[str, str], tuple[int, object]]:
    """(file, qualname) -> (recency: 0 = changed by the newest commit, symbol) over `commits` (newest first)."""
    out = {}
    for age, commit in enumerate(commits):
        for change in commit_changes(repo, commit.sha, commit_diff(repo, commit.sha), index):
            sym = change.symbol
            if sym is not None and sym.kind != "class":
                out.setdefault((sym.file, sym.qualname), (age, sym))
    return out


NATIVE_RESTORES = 12  # restores of functions whose run the record cannot see: each rebuilds a native tree


def restore_plan(
    changed: dict[tuple[str, str], tuple[int, object]], record: Coverage | None
) -> list[tuple[int, tuple[str, str], bool | None]]:
    """(age, key, ran) newest first: every changed function the record says ran (ran True), and every
    one it cannot see (ran None: no record on a native tree, or a C/C++ file next to recorded
    Python). Those it says did not run are left out. Pure."""
    plan = [(age, key, ran(record, *key)) for key, (age, _) in changed.items()]
    return sorted(p for p in plan if p[2] is not False)


def restore_and_probe(case: CaseInput, prober: Prober, before_ref: str, sym) -> str:
    """'removed' when the divergence is gone once `sym` is restored to its version at before_ref,
    'kept' when it stays, 'same code' when only comments changed since (nothing to run: the tree
    would behave as HEAD does), 'untestable' when it cannot be restored or run."""
    try:
        old = open_index(case.repo, commit=before_ref, include_tests=False)
        prev = next((s for s in old.find(sym.qualname) if s.file == sym.file), None)
        if prev is None:
            return "untestable"  # added inside the window: nothing to restore
        head = open_index(case.repo, include_tests=False)
        if same_code(sym.file, head.read(sym), old.read(prev)):
            return "same code"
        with temporary_worktree(case.repo, "HEAD") as tree:
            if not restore_version(tree, sym.file, sym.qualname, old.read(prev), old):
                return "untestable"
            return "kept" if prober.probe(case.scenario, tree, taps=OUTPUT_TAPS).diverged else "removed"
    except (GitError, EngineRunError):
        return "untestable"


def revert_recent(
    case: CaseInput, out_dir: Path, config: RunConfig | None = None, last: int | None = RECENT_COMMITS
) -> dict:
    start, prober = time.monotonic(), make_prober(config)
    result = prober.probe(case.scenario, case.repo, taps=OUTPUT_TAPS)
    first = result.first.to_dict() if result.first else None
    commits = recent_commits(case.repo, last)
    if not result.diverged or not commits:
        return _report(case, result.diverged, first, [], prober, start)
    record = Coverage.from_meta(prober.run_target(case.scenario, case.repo, taps=[], coverage=True).meta)
    index = open_index(case.repo, include_tests=False)
    changed = changed_functions(case.repo, index, commits)
    before = f"{commits[-1].sha}^"
    scored, rebuilt = [], 0
    for age, key, state in restore_plan(changed, record):
        if state is None and rebuilt >= NATIVE_RESTORES:
            verdict = "over budget"
        else:
            verdict = restore_and_probe(case, prober, before, changed[key][1])
            rebuilt += state is None and verdict != "same code"
        scored.append((verdict != "removed", age, key, _why(verdict, age, state)))
    scored.sort()
    hyps = [_hyp(i + 1, changed[key][1], why, commits[age].sha) for i, (_, age, key, why) in enumerate(scored)]
    return _report(case, True, first, hyps, prober, start)


def revert_recent_all(case: CaseInput, out_dir: Path, config: RunConfig | None = None) -> dict:
    return revert_recent(case, out_dir, config, last=None)


VERDICTS = {
    "removed": "restoring it removes the divergence",
    "kept": "restoring it leaves the divergence",
    "same code": "only its comments changed: restoring it would change nothing",
    "untestable": "could not be restored",
    "over budget": f"not restored: the {NATIVE_RESTORES} restores for functions coverage cannot see were spent",
}


def _why(verdict: str, age: int, ran: bool | None) -> str:
    seen = "ran in the scenario" if ran else "whether it ran is unknown (its language has no function coverage)"
    return f"{VERDICTS[verdict]}; last changed {age + 1} commit(s) back, {seen}"
