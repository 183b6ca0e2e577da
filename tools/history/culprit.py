"""Commit bisection with the probe as oracle, in temporary worktrees (never the user's checkout)."""

from __future__ import annotations

from pathlib import Path

from tools.engines.runner import EngineRunError
from tools.history.bisect import bisect_commits
from tools.history.gitrepo import GitError, resolve
from tools.hypotheses.evidence import Culprit, Reproduction
from tools.probe.prober import Prober

ORACLE_TIMEOUT_S = 300.0


def probe_oracle(repro: Reproduction, prober: Prober):
    """(worktree, sha) -> good | bad; an engine crash or hang raises, which bisection counts as skip."""

    def oracle(worktree: Path, commit: str, timeout: float | None = None) -> str:
        try:
            return (
                "bad"
                if prober.probe(repro.scenario, worktree, timeout=timeout or ORACLE_TIMEOUT_S).diverged
                else "good"
            )
        except EngineRunError as e:
            raise RuntimeError(f"{e.kind}: {e}") from None

    return oracle


def find_culprit(
    repo: Path,
    good_ref: str | None,
    repro: Reproduction,
    prober: Prober,
    timeout_s: float = ORACLE_TIMEOUT_S,
    votes: int = 1,
) -> Culprit | None:
    """First bad commit between good_ref and HEAD, or None without a good ref (or if it fails)."""
    if not good_ref:
        return None
    try:
        good, head = resolve(repo, good_ref), resolve(repo, "HEAD")
    except GitError:
        return None
    if good == head:
        return None
    before = prober.engine_runs
    result = bisect_commits(repo, good, head, probe_oracle(repro, prober), timeout_s=timeout_s, votes=votes)
    tested = [(t.sha, t.verdict) for t in result.trials]
    runs = prober.engine_runs - before
    if result.first_bad is None:
        if not result.candidates:
            return None
        last = result.candidates[-1]
        return Culprit(last.sha, last.subject, result.message, "", tested, [c.sha for c in result.candidates], runs)
    c = result.first_bad
    return Culprit(c.sha, c.subject, result.message, result.diff, tested, [], runs)
