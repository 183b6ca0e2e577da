"""bisect_commits on a real 12-commit history with a real subprocess oracle.

Commit i writes app.py with VALUE = 1 (correct) or 2 (the bug, from commit `bug_at` on);
marker files make chosen commits crash on import, hang, or answer wrongly once (flaky).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.history.bisect import Budget, accepted, bisect_commits, bounds, command_oracle, next_probe, settled

N_COMMITS = 12
CALL_BUDGET = math.ceil(math.log2(N_COMMITS - 1)) + 1  # probes + at most one endpoint check
ORACLE_SCRIPT = """
import os, sys, time
sys.path.insert(0, os.getcwd())
if os.path.exists("HANG"):
    open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
    time.sleep(1000)
import app                                  # a broken commit raises here: exit 1 = crash
bad = app.VALUE != 1
if os.path.exists("FLAKY") and not os.path.exists(os.environ["FLAKY_SEEN"]):
    open(os.environ["FLAKY_SEEN"], "w").close()
    bad = not bad                           # first answer on the flaky commit is wrong
sys.exit(10 if bad else 0)
"""


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    cmd = ["git", "-c", "init.defaultBranch=main", "-C", str(repo), *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, input=stdin).stdout


def history(tmp_path: Path, bug_at: int, crash=(), hang=(), flaky=()) -> tuple[Path, list[str]]:
    """Build the history in one `git fast-import` (a commit per loop of `git commit` is slow)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    stream = []
    for i in range(N_COMMITS):
        app = "raise RuntimeError('broken build')\n" if i in crash else f"VALUE = {2 if i >= bug_at else 1}\n"
        message = f"commit {i}\n\ndetails of commit {i}\n"
        stream += [
            f"commit refs/heads/main\nmark :{i + 1}\n",
            f"committer Tester <t@example.com> {1704067200 + i} +0000\n",
            f"data {len(message)}\n{message}",
            f"from :{i}\n" if i else "",
            _blob("app.py", app),
            _blob("log.txt", f"commit {i}\n"),
        ]
        for marker, where in (("HANG", hang), ("FLAKY", flaky)):
            stream.append(_blob(marker, "") if i in where else f"D {marker}\n")
    git(repo, "fast-import", "--quiet", stdin="".join(stream) + "done\n")
    git(repo, "tag", "good", "main~11")
    return repo, git(repo, "rev-list", "--reverse", "main").split()


def _blob(path: str, text: str) -> str:
    return f"M 100644 inline {path}\ndata {len(text.encode())}\n{text}\n"


def oracle_for(tmp_path: Path):
    script = tmp_path / "oracle.py"
    script.write_text(ORACLE_SCRIPT)
    env = {
        "PID_FILE": str(tmp_path / "hang.pid"),
        "FLAKY_SEEN": str(tmp_path / "flaky.seen"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return command_oracle([sys.executable, str(script)], exit_verdicts={0: "good", 10: "bad"}, env=env)


@pytest.mark.parametrize("bug_at", [1, 4, 8, 11])
def test_finds_the_commit_that_introduced_the_bug_in_log2_calls(tmp_path, bug_at):
    repo, shas = history(tmp_path, bug_at)
    result = bisect_commits(repo, "good", "HEAD", oracle_for(tmp_path), timeout_s=30)
    assert result.status == "found"
    assert result.first_bad.sha == shas[bug_at]
    assert result.first_bad.subject == f"commit {bug_at}"
    assert f"details of commit {bug_at}" in result.first_bad.message
    assert "+VALUE = 2" in result.diff and "-VALUE = 1" in result.diff
    assert result.last_good.sha == shas[bug_at - 1]
    assert result.oracle_calls <= CALL_BUDGET
    assert all(t.verdict in ("good", "bad") and t.seconds > 0 for t in result.trials)


def test_crashing_commit_is_skipped_and_a_neighbour_probed(tmp_path):
    repo, shas = history(tmp_path, bug_at=8, crash={5, 6})
    result = bisect_commits(repo, "good", "HEAD", oracle_for(tmp_path), timeout_s=30)
    assert result.first_bad.sha == shas[8]
    skipped = [t for t in result.trials if t.verdict == "skip"]
    assert skipped and all(t.note.startswith("error: OracleCrash") for t in skipped)
    assert result.oracle_calls <= CALL_BUDGET + len(skipped)


def test_crash_next_to_the_bug_is_reported_as_an_ambiguous_range(tmp_path):
    repo, shas = history(tmp_path, bug_at=6, crash={5})
    result = bisect_commits(repo, "good", "HEAD", oracle_for(tmp_path), timeout_s=30)
    assert result.status == "ambiguous" and result.ambiguous
    assert result.first_bad is None
    assert [c.sha for c in result.candidates] == [shas[5], shas[6]]
    assert result.last_good.sha == shas[4]


def test_python_oracle_that_raises_counts_as_skip(tmp_path):
    repo, shas = history(tmp_path, bug_at=3)

    def oracle(worktree: Path, commit: str) -> str:
        if commit == shas[5]:
            raise OSError("engine run failed")
        return "bad" if "VALUE = 2" in (worktree / "app.py").read_text() else "good"

    result = bisect_commits(repo, "good", "HEAD", oracle, timeout_s=30)
    assert result.first_bad.sha == shas[3]
    assert ("skip", "error: OSError: engine run failed") in [(t.verdict, t.note) for t in result.trials]


def test_hanging_commit_is_killed_at_the_timeout_and_skipped(tmp_path):
    repo, shas = history(tmp_path, bug_at=8, hang={5})
    started = time.monotonic()
    result = bisect_commits(repo, "good", "HEAD", oracle_for(tmp_path), timeout_s=1.5)
    assert result.first_bad.sha == shas[8]
    hung = [t for t in result.trials if t.sha == shas[5]]
    assert [t.note for t in hung] == ["timeout"] and 1.4 < hung[0].seconds < 4
    pid = int((tmp_path / "hang.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the sleeping process is gone
    assert time.monotonic() - started < 15


def test_oracle_ignoring_its_deadline_is_abandoned(tmp_path):
    """An oracle with no `timeout` parameter that blocks still cannot stall the search."""
    repo, shas = history(tmp_path, bug_at=2)

    def oracle(worktree: Path, commit: str) -> str:
        if commit == shas[5]:
            time.sleep(1.5)
        return "bad" if "VALUE = 2" in (worktree / "app.py").read_text() else "good"

    result = bisect_commits(repo, "good", "HEAD", oracle, timeout_s=0.3)
    assert result.first_bad.sha == shas[2]
    assert any(t.note.startswith("timeout") for t in result.trials)


@pytest.mark.parametrize("bug_at", [3, 8])
def test_flaky_first_probe_is_outvoted_at_the_boundary(tmp_path, bug_at):
    """Commit 5 (the first probe) answers wrongly once; votes=3 recovers, votes=1 cannot."""
    repo, shas = history(tmp_path, bug_at, flaky={5})
    result = bisect_commits(repo, "good", "HEAD", oracle_for(tmp_path), timeout_s=30, votes=3)
    assert result.status == "found" and result.first_bad.sha == shas[bug_at]
    assert len([t for t in result.trials if t.sha == shas[5]]) == 3
    assert result.oracle_calls <= CALL_BUDGET + 6

    (tmp_path / "flaky.seen").unlink()
    naive = bisect_commits(repo, "good", "HEAD", oracle_for(tmp_path), timeout_s=30, votes=1)
    assert naive.first_bad is None or naive.first_bad.sha != shas[bug_at]


def test_good_ref_that_is_actually_bad(tmp_path):
    repo, _ = history(tmp_path, bug_at=0)
    result = bisect_commits(repo, "good", "HEAD", oracle_for(tmp_path), timeout_s=30)
    assert result.status == "good_is_bad" and result.first_bad is None
    assert "predates" in result.message


@pytest.mark.parametrize("check_endpoints", [False, True])
def test_bad_ref_that_is_actually_good(tmp_path, check_endpoints):
    repo, _ = history(tmp_path, bug_at=N_COMMITS)
    result = bisect_commits(repo, "good", "HEAD", oracle_for(tmp_path), timeout_s=30, check_endpoints=check_endpoints)
    assert result.status == "bad_is_good" and result.first_bad is None
    assert result.oracle_calls == (1 if check_endpoints else CALL_BUDGET)


def test_retries_rerun_a_transient_failure(tmp_path):
    repo, shas = history(tmp_path, bug_at=6)
    failures = {shas[5]: 1}

    def oracle(worktree: Path, commit: str) -> str:
        if failures.get(commit):
            failures[commit] -= 1
            raise ConnectionError("device busy")
        return "bad" if "VALUE = 2" in (worktree / "app.py").read_text() else "good"

    result = bisect_commits(repo, "good", "HEAD", oracle, timeout_s=30, retries=1)
    assert result.status == "found" and result.first_bad.sha == shas[6]
    assert [t.verdict for t in result.trials if t.sha == shas[5]] == ["skip", "good"]


def test_search_state_is_pure():
    budget = Budget(votes=3)
    assert accepted(["good", "bad", "bad"]) == "bad" and accepted(["skip"]) is None
    assert settled(["bad", "bad"], budget) and not settled(["bad", "good"], budget)
    assert bounds(11, {}) == (0, 11)  # endpoints by assumption
    assert bounds(11, {5: ["bad"], 2: ["good"]}) == (2, 5)
    assert bounds(11, {0: ["bad"]}) == (0, 0)
    assert bounds(11, {11: ["good"]}) == (11, None)
    assert next_probe(2, 5, {3: ["skip"]}) == 4
    assert next_probe(2, 4, {3: ["skip"]}) is None
    with pytest.raises(ValueError, match="odd"):
        Budget(votes=2)
