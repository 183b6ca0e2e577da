"""Bisect a target's first-parent history with a probe as oracle.

The search keeps every verdict it has seen (`votes[i]` for commit i of the chain
`[good, c1, …, bad]`) and recomputes its bounds from them after each oracle call:
`hi` = the earliest commit judged bad, `lo` = the latest commit judged good before it.
The endpoints count as good/bad *by assumption* until tested.

* **Probing** picks the untested commit nearest the middle of (lo, hi): ⌈log2 N⌉ calls.
* **Skips** (the oracle says "skip", raises, or runs past its deadline) take a commit out
  of probing; the next probe is its nearest untested neighbour, like `git bisect skip`.
  Skipped commits left between lo and hi make the answer *ambiguous*: the first bad
  commit is one of them or hi, and `candidates` lists that range.
* **Votes** handle a flaky oracle without re-running every probe. A single wrong verdict
  anywhere in the search always surfaces at the boundary it produces (a good commit called
  bad becomes `hi`; a bad one called good becomes `lo`), so only the two boundary commits
  are re-run until a majority of `votes` agrees. If the majority contradicts the first
  verdict, the bounds move and the search goes on from there. Cost on a steady oracle:
  +1 call per boundary commit for votes=3, nothing for votes=1.
* **Endpoints** are tested lazily, only when they end up on the boundary, or up front
  with `check_endpoints=True`: "good ref is actually bad" and "bad ref is actually good"
  are reported as such instead of a wrong culprit.
* **Deadlines**: an oracle that takes a `timeout` keyword gets `timeout_s` and is expected
  to kill what it started (`command_oracle` does, by process group); every oracle also runs
  in a worker thread that is abandoned after the deadline, so the search never hangs.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tools import progress
from tools.history.gitrepo import (
    CommitInfo,
    commit_diff,
    commit_info,
    first_parent_range,
    retire_worktree,
    scratch_worktree,
)
from tools.procgroup import run_in_group

VERDICTS = ("good", "bad", "skip")
GIT_BISECT_SKIP = 125
SAID_SKIP = "oracle said skip"  # a deliberate skip: not retried
ABANDONED = "timeout (oracle abandoned)"  # the oracle overran its grace period and still runs


class Oracle(Protocol):
    """(worktree of the commit, its sha) -> "good" | "bad" | "skip". May take `timeout=`."""

    def __call__(self, worktree: Path, commit: str) -> str: ...


class OracleTimeout(RuntimeError):
    pass


class OracleCrash(RuntimeError):
    pass


@dataclass(frozen=True)
class Trial:
    sha: str
    verdict: str  # good | bad | skip
    seconds: float
    note: str = ""  # why a skip: "timeout", "error: …", "oracle said skip"


@dataclass
class BisectResult:
    status: str  # found | ambiguous | good_is_bad | bad_is_good
    first_bad: CommitInfo | None  # set when status == "found"
    diff: str  # unified diff of first_bad ("" otherwise)
    last_good: CommitInfo | None
    candidates: list[CommitInfo]  # oldest first: [first_bad], or the skipped range + hi
    trials: list[Trial]
    message: str

    @property
    def oracle_calls(self) -> int:
        return len(self.trials)

    @property
    def ambiguous(self) -> bool:
        return self.status == "ambiguous"


@dataclass(frozen=True)
class Budget:
    timeout_s: float = 600.0
    retries: int = 0  # re-runs of a commit whose oracle raised or timed out
    votes: int = 1  # odd; boundary commits are re-run until a majority of this many agrees

    def __post_init__(self):
        if self.timeout_s <= 0 or self.retries < 0:
            raise ValueError("timeout_s must be > 0 and retries >= 0")
        if self.votes < 1 or self.votes % 2 == 0:
            raise ValueError(f"votes must be a positive odd number, got {self.votes}")

    @property
    def majority(self) -> int:
        return self.votes // 2 + 1


# --- pure search state -------------------------------------------------------------------------


def accepted(votes: Sequence[str]) -> str | None:
    """Majority of the good/bad votes; None for no votes, all skips or a tie."""
    good, bad = votes.count("good"), votes.count("bad")
    return "good" if good > bad else "bad" if bad > good else None


def settled(votes: Sequence[str], budget: Budget) -> bool:
    good, bad = votes.count("good"), votes.count("bad")
    return max(good, bad) >= budget.majority or len(votes) >= budget.votes


def verdict_at(i: int, n: int, votes: Mapping[int, list[str]]) -> str | None:
    """Accepted verdict of chain index i; the endpoints fall back to what the user claimed."""
    seen = accepted(votes.get(i, []))
    if seen is None and i in (0, n):
        return "good" if i == 0 else "bad"
    return seen


def bounds(n: int, votes: Mapping[int, list[str]]) -> tuple[int, int | None]:
    """(lo, hi): latest good before the earliest bad, and that earliest bad (None: no bad)."""
    verdicts = [verdict_at(i, n, votes) for i in range(n + 1)]
    hi = next((i for i, v in enumerate(verdicts) if v == "bad"), None)
    top = n + 1 if hi is None else hi
    lo = max((i for i in range(top) if verdicts[i] == "good"), default=0)
    return lo, hi


def next_probe(lo: int, hi: int, votes: Mapping[int, list[str]]) -> int | None:
    """The untested commit strictly between lo and hi nearest their middle (None: none left)."""
    middle = (lo + hi) / 2
    untested = [i for i in range(lo + 1, hi) if not votes.get(i)]
    return min(untested, key=lambda i: (abs(i - middle), i)) if untested else None


# --- the search --------------------------------------------------------------------------------


def bisect_commits(
    repo_path: str | Path,
    good: str,
    bad: str,
    oracle: Oracle,
    *,
    timeout_s: float = 600.0,
    retries: int = 0,
    votes: int = 1,
    check_endpoints: bool = False,
) -> BisectResult:
    """Find the first bad commit on bad's first-parent chain after `good` (see module doc)."""
    budget = Budget(timeout_s, retries, votes)
    chain = [commit_info(repo_path, good)] + first_parent_range(repo_path, good, bad)
    n = len(chain) - 1
    if n == 0:
        raise ValueError(f"good {good!r} and bad {bad!r} are the same commit")
    seen: dict[int, list[str]] = {}
    trials: list[Trial] = []

    def vote(i: int) -> None:
        with progress.task(f"bisect step {len(trials) + 1}: commit {i}/{n} {chain[i].sha[:10]}"):
            seen.setdefault(i, []).append(_vote(repo_path, chain[i].sha, oracle, budget, trials))

    def settle(i: int) -> None:
        while not settled(seen.get(i, []), budget):
            vote(i)

    if check_endpoints:
        settle(n)
        if verdict_at(n, n, seen) == "bad":
            settle(0)
    while True:
        lo, hi = bounds(n, seen)
        if hi is None or hi == 0:
            return _result(repo_path, chain, lo, hi, trials)
        probe = next_probe(lo, hi, seen)
        if probe is not None:
            vote(probe)
            continue
        unsettled = [i for i in (hi, lo) if not settled(seen.get(i, []), budget)]
        if not unsettled:
            return _result(repo_path, chain, lo, hi, trials)
        settle(unsettled[0])


def _vote(repo_path, sha: str, oracle: Oracle, budget: Budget, trials: list[Trial]) -> str:
    """One vote for a commit: the oracle's verdict, retried on crash/timeout up to `retries`."""
    for _ in range(budget.retries + 1):
        with scratch_worktree(repo_path, sha) as tree:
            trial = consult(oracle, tree, sha, budget.timeout_s)
            if trial.note == ABANDONED:
                retire_worktree(tree)  # its oracle may still be at work in it
        trials.append(trial)
        if trial.verdict != "skip" or trial.note == SAID_SKIP:
            return trial.verdict
    return "skip"


def _result(repo_path, chain: list[CommitInfo], lo: int, hi: int | None, trials: list[Trial]) -> BisectResult:
    if hi is None:
        return BisectResult(
            "bad_is_good",
            None,
            "",
            chain[-1],
            [],
            trials,
            f"bad ref {chain[-1].sha[:10]} tested good: the bug does not reproduce there",
        )
    if hi == 0:
        return BisectResult(
            "good_is_bad",
            None,
            "",
            None,
            [],
            trials,
            f"good ref {chain[0].sha[:10]} tested bad: the bug predates the range",
        )
    candidates = chain[lo + 1 : hi + 1]
    if len(candidates) == 1:
        culprit = chain[hi]
        return BisectResult(
            "found",
            culprit,
            commit_diff(repo_path, culprit.sha),
            chain[lo],
            candidates,
            trials,
            f"first bad commit {culprit.sha[:10]} {culprit.subject}",
        )
    return BisectResult(
        "ambiguous",
        None,
        "",
        chain[lo],
        candidates,
        trials,
        f"first bad commit is one of {len(candidates)} (skipped commits between "
        f"{chain[lo].sha[:10]} and {chain[hi].sha[:10]})",
    )


# --- running one oracle call -------------------------------------------------------------------


def consult(oracle: Oracle, worktree: Path, sha: str, timeout_s: float) -> Trial:
    """Run the oracle once under a deadline; a raise, a hang or a bad verdict is a skip."""
    takes_timeout = _accepts_timeout(oracle)
    kwargs = {"timeout": timeout_s} if takes_timeout else {}
    box: dict = {}

    def target():
        try:
            box["verdict"] = oracle(worktree, sha, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - any failure of the oracle is a skip
            box["error"] = exc

    started = time.monotonic()
    worker = threading.Thread(target=target, name=f"oracle-{sha[:8]}", daemon=True)
    worker.start()
    # An oracle that enforces its own timeout gets a grace period to kill and reap.
    worker.join(timeout_s + (1.0 + 0.1 * timeout_s if takes_timeout else 0.0))
    seconds = time.monotonic() - started
    if worker.is_alive():
        return Trial(sha, "skip", seconds, ABANDONED)
    return _trial_from(box, sha, seconds)


def _trial_from(box: dict, sha: str, seconds: float) -> Trial:
    error = box.get("error")
    if isinstance(error, (OracleTimeout, subprocess.TimeoutExpired)):
        return Trial(sha, "skip", seconds, "timeout")
    if error is not None:
        return Trial(sha, "skip", seconds, f"error: {type(error).__name__}: {error}"[:500])
    verdict = str(box.get("verdict", "")).strip().lower()
    if verdict not in VERDICTS:
        return Trial(sha, "skip", seconds, f"error: invalid verdict {box.get('verdict')!r}")
    return Trial(sha, verdict, seconds, SAID_SKIP if verdict == "skip" else "")


def _accepts_timeout(oracle: Callable) -> bool:
    try:
        params = inspect.signature(oracle).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "timeout" or p.kind is p.VAR_KEYWORD for p in params)


# --- a subprocess oracle -----------------------------------------------------------------------


def command_oracle(
    argv: Sequence[str] | Callable[[Path, str], Sequence[str]],
    *,
    exit_verdicts: Mapping[int, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Callable[..., str]:
    """An oracle that runs a command in the worktree and reads its exit code.

    Default mapping follows `git bisect run`: 0 good, 125 skip, 1-127 bad; anything else
    (a signal, >127) is a crash. With `exit_verdicts` only the listed codes count and any
    other exit is a crash, so a test script can tell "bad" from "crashed on import".
    The command runs in its own process group, killed as a whole at the timeout.
    """

    def oracle(worktree: Path, commit: str, timeout: float | None = None) -> str:
        cmd = list(argv(worktree, commit) if callable(argv) else argv)
        code, tail = _run_group(cmd, worktree, timeout, {**os.environ, **(env or {})})
        verdict = _exit_verdict(code, exit_verdicts)
        if verdict is None:
            raise OracleCrash(f"{cmd[0]} exited {code}: {tail}")
        return verdict

    return oracle


def _exit_verdict(code: int, exit_verdicts: Mapping[int, str] | None) -> str | None:
    if exit_verdicts is not None:
        return exit_verdicts.get(code)
    if code == 0:
        return "good"
    if code == GIT_BISECT_SKIP:
        return "skip"
    return "bad" if 0 < code < 128 else None


def _run_group(cmd: list[str], cwd: Path, timeout: float | None, env: dict) -> tuple[int, str]:
    code, out = run_in_group(cmd, cwd, env, timeout)
    if code is None:
        raise OracleTimeout(f"{cmd[0]} killed after {timeout}s")
    return code, out.strip()[-300:]
