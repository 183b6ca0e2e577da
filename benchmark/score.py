"""Scoring: report.json dicts + Truth -> verdicts (docs/design.md §6). Pure: no files, no git.

Definitions (one place, so every table means the same thing):

- A hypothesis *matches* when its `file` and `function` equal the truth's. Paths forgive
  only a leading `./` or `/`; function names are compared exactly.
- Hypotheses count in list order (the report lists them best first); only the first 5 count.
- Ties: hypotheses with the same `verified` flag and the same `confidence` (to 1e-6) form a tie
  whose order is the list's, not the evidence's. `rank_worst` places the match last in its tie
  (None when that falls past 5), and pass@1 (ties worst) counts a rank 1 only when the match
  is alone at the top. Both are reported next to the plain figures, so a win on list order shows.
- pass@1 / pass@5 of one run: the first 1 / 5 hypotheses contain a match.
  With n samples (runs) of a case, c of them passing, the case scores the unbiased
  estimator 1 - C(n-c,k)/C(n,k) with k = 1 (= c/n), so one run and many runs read alike.
- runs_pass@k (only with n >= k samples): the same estimator over runs, k = 1, 5: the chance
  that at least one of k independent runs puts a match at rank 1 (Codex-style pass@k).
- Component hit (Ekka's granularity): the rank-1 hypothesis names the truth file, OR its
  `component` field equals the truth's `component` (case-insensitive).
- Commit hit: the report's `commit` ({"sha", "subject"}; if absent, the rank-1 hypothesis'
  `commit`) names the truth commit: a sha prefix of >= 7 hex digits of the built commit, or
  its exact subject line. None when the truth has no commit (bug present since base) or no
  commit map is known.
- Cost per case: `cost.engine_runs`, `cost.tokens_in + cost.tokens_out`, `cost.wall_s`,
  `cost.cpu_s` (CPU seconds of the diagnosis's processes, benchmark/cputime.py), mean over samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from math import comb
from typing import Any

from benchmark.cases import DEFAULT_TRACK, TRACKS, Truth, normalize_repo_path

TOP_K = 5
RUNS_K = (1, 5)
Report = Mapping[str, Any]
CommitMap = Mapping[str, Any]  # {"base": sha, "patches": {stem: {"sha": …, "subject": …}}}


@dataclass(frozen=True)
class CaseScore:
    case: str
    category: str
    subject: str
    samples: int
    rank: int | None  # rank of the first match in sample 0 (None: no match in the top 5)
    rank_worst: int | None  # the same match placed last among the hypotheses it ties with
    top1_hits: int  # samples whose rank-1 hypothesis matches
    top5_hits: int  # samples whose top 5 contain a match
    pass_at_1: float
    pass_at_5: float
    pass_at_1_ties: float  # share of samples whose match is alone at rank 1 (no tie on confidence)
    runs_pass_at: dict[int, float]  # k -> estimator over runs, for k <= samples
    component: float  # share of samples with a component hit
    commit: float | None  # share of samples naming the truth commit
    engine_runs: float
    tokens: float
    wall_s: float
    errors: int  # samples whose report carries "error"
    track: str = DEFAULT_TRACK  # the case's track (easy, hard, at-base, real): its own row in the summary
    cpu_s: float = 0.0  # CPU seconds, mean over samples (0 when the reports carry none)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Aggregate:
    cases: int
    pass_at_1: float
    pass_at_5: float
    pass_at_1_ties: float
    component_acc: float
    commit_acc: float | None  # over cases whose truth names a commit
    engine_runs: float  # means per case
    tokens: float
    wall_s: float
    errors: int
    runs_pass_at: dict[int, float]
    cpu_s: float = 0.0  # mean per case; times `cases` is the CPU the group took

    def to_dict(self) -> dict:
        return asdict(self)


def unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): chance that k of n samples, c of them correct, hold a correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def hypothesis_matches(hypothesis: Mapping[str, Any], truth: Truth) -> bool:
    file, function = hypothesis.get("file"), hypothesis.get("function")
    if not isinstance(file, str) or not isinstance(function, str):
        return False
    return normalize_repo_path(file) == truth.file and function.strip() == truth.function


def hypotheses(report: Report) -> list[Mapping[str, Any]]:
    hyps = report.get("hypotheses") or []
    return [h for h in hyps if isinstance(h, Mapping)][:TOP_K]


def first_match_rank(report: Report, truth: Truth) -> int | None:
    """1-based rank of the first matching hypothesis in the top 5, or None."""
    for rank, h in enumerate(hypotheses(report), 1):
        if hypothesis_matches(h, truth):
            return rank
    return None


def _tie_key(hypothesis: Mapping[str, Any]) -> tuple[bool, float] | None:
    """(verified, confidence to 1e-6), or None when the hypothesis has no numeric confidence (never tied)."""
    confidence = hypothesis.get("confidence")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        return None
    return bool(hypothesis.get("verified")), round(float(confidence), 6)


def worst_match_rank(report: Report, truth: Truth) -> int | None:
    """The first match's rank if it were placed last among the hypotheses that tie with it; None past 5."""
    hyps = [h for h in (report.get("hypotheses") or []) if isinstance(h, Mapping)]
    rank = first_match_rank(report, truth)
    if rank is None:
        return None
    key = _tie_key(hyps[rank - 1])
    worst = rank
    while key is not None and worst < len(hyps) and _tie_key(hyps[worst]) == key:
        worst += 1
    return worst if worst <= TOP_K else None


def component_hit(report: Report, truth: Truth) -> bool:
    top = hypotheses(report)[:1]
    if not top:
        return False
    file, component = top[0].get("file"), top[0].get("component")
    same_file = isinstance(file, str) and normalize_repo_path(file) == truth.file
    same_component = isinstance(component, str) and component.strip().lower() == truth.component.strip().lower()
    return same_file or same_component


def commit_hit(report: Report, truth: Truth, commits: CommitMap | None) -> bool | None:
    if truth.commit is None or not commits:
        return None
    want = commits["patches"][truth.commit]
    named = report.get("commit")
    if not named:
        top = hypotheses(report)[:1]
        named = top[0].get("commit") if top else None
    if isinstance(named, str):
        named = {"sha": named, "subject": named}
    if not isinstance(named, Mapping):
        return False
    sha = str(named.get("sha") or "").strip().lower()
    subject = str(named.get("subject") or "").strip()
    return (len(sha) >= 7 and want["sha"].startswith(sha)) or (bool(subject) and subject == want["subject"])


def report_cost(report: Report) -> tuple[float, float, float]:
    """report -> (engine runs, LLM tokens in+out, wall seconds); missing numbers count 0."""
    cost = report.get("cost") or {}

    def num(key: str) -> float:
        value = cost.get(key, 0)
        return float(value) if isinstance(value, (int, float)) else 0.0

    return num("engine_runs"), num("tokens_in") + num("tokens_out"), num("wall_s")


def report_cpu_s(report: Report) -> float:
    """report -> CPU seconds of its diagnosis (`cost.cpu_s`); 0 when missing."""
    value = (report.get("cost") or {}).get("cpu_s", 0)
    return float(value) if isinstance(value, (int, float)) else 0.0


def score_case(
    case: str,
    category: str,
    subject: str,
    reports: Sequence[Report],
    truth: Truth,
    commits: CommitMap | None = None,
    track: str = DEFAULT_TRACK,
) -> CaseScore:
    """One case's reports (one per sample) -> its verdict."""
    if not reports:
        raise ValueError(f"case {case}: no reports to score")
    n = len(reports)
    ranks = [first_match_rank(r, truth) for r in reports]
    worst = [worst_match_rank(r, truth) for r in reports]
    top1 = sum(r == 1 for r in ranks)
    top5 = sum(r is not None for r in ranks)
    commit_hits = [commit_hit(r, truth, commits) for r in reports]
    costs = [report_cost(r) for r in reports]
    return CaseScore(
        case=case,
        category=category,
        subject=subject,
        samples=n,
        rank=ranks[0],
        rank_worst=worst[0],
        top1_hits=top1,
        top5_hits=top5,
        pass_at_1=unbiased_pass_at_k(n, top1, 1),
        pass_at_5=unbiased_pass_at_k(n, top5, 1),
        pass_at_1_ties=_mean([r == 1 for r in worst]),
        runs_pass_at={k: unbiased_pass_at_k(n, top1, k) for k in RUNS_K if k <= n},
        component=_mean([component_hit(r, truth) for r in reports]),
        commit=None if commit_hits[0] is None else _mean(commit_hits),
        engine_runs=_mean([c[0] for c in costs]),
        tokens=_mean([c[1] for c in costs]),
        wall_s=_mean([c[2] for c in costs]),
        errors=sum(bool(r.get("error")) for r in reports),
        track=track,
        cpu_s=_mean([report_cpu_s(r) for r in reports]),
    )


def aggregate(scores: Sequence[CaseScore]) -> Aggregate:
    """Case verdicts -> means over cases (commit accuracy over cases whose truth names a commit)."""
    commits = [s.commit for s in scores if s.commit is not None]
    runs_k = {k: [s.runs_pass_at[k] for s in scores if k in s.runs_pass_at] for k in RUNS_K}
    return Aggregate(
        cases=len(scores),
        pass_at_1=_mean([s.pass_at_1 for s in scores]),
        pass_at_5=_mean([s.pass_at_5 for s in scores]),
        pass_at_1_ties=_mean([s.pass_at_1_ties for s in scores]),
        component_acc=_mean([s.component for s in scores]),
        commit_acc=_mean(commits) if commits else None,
        engine_runs=_mean([s.engine_runs for s in scores]),
        tokens=_mean([s.tokens for s in scores]),
        wall_s=_mean([s.wall_s for s in scores]),
        errors=sum(s.errors for s in scores),
        runs_pass_at={k: _mean(v) for k, v in runs_k.items() if v and len(v) == len(scores)},
        cpu_s=_mean([s.cpu_s for s in scores]),
    )


def summarize(scores: Sequence[CaseScore]) -> dict[str, Any]:
    """Overall, per-category, per-subject and per-track aggregates (sorted; tracks in TRACKS order)."""

    def by(key: str, order: Sequence[str] = ()) -> dict[str, Aggregate]:
        groups: dict[str, list[CaseScore]] = {}
        for s in scores:
            groups.setdefault(getattr(s, key), []).append(s)
        rank = {name: i for i, name in enumerate(order)}
        names = sorted(groups, key=lambda name: (rank.get(name, len(rank)), name))
        return {name: aggregate(groups[name]) for name in names}

    return {
        "overall": aggregate(scores),
        "by_category": by("category"),
        "by_subject": by("subject"),
        "by_track": by("track", TRACKS),
    }


def _mean(values: Sequence[float | bool]) -> float:
    return sum(float(v) for v in values) / len(values) if values else 0.0
