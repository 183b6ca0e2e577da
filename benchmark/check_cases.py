"""Does the default sweep catch each benchmark case's bug? `python -m benchmark.check_cases [ids]`.

For every case: build its repo, check out its bug alone (the culprit commit cherry-picked onto
`base`; the base itself for a bug at base; the first bad release for a release history), and run
`python -m agent.check --fail-fast --no-diagnose` with the default matrix against that tree. A
case is caught when some cell fails. Prints one row per case and the share caught; writes
`check_cases.json` under --out. Nothing of the case's truth reaches the sweep: it only chooses
which tree to sweep.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmark.build import build_case_repo, git, read_commit_map
from benchmark.cases import Case, load_cases, load_truth
from tools.errors import EPILOG, run_cli, writable_dir
from tools.history.gitrepo import GitError

ROOT = Path(__file__).resolve().parents[1]


def bug_alone(case: Case, repo: Path, tree: Path) -> str:
    """Check out the case's bug without the rest of its history into `tree`; says how."""
    truth = load_truth(case)
    if truth.commit is None:
        git(repo, "worktree", "add", "-q", "--detach", str(tree), "base")
        return "base (bug at base)"
    sha = read_commit_map(repo)["patches"][truth.commit]["sha"]
    if case.releases is not None:
        git(repo, "worktree", "add", "-q", "--detach", str(tree), sha)
        return f"first bad release {truth.commit}"
    git(repo, "worktree", "add", "-q", "--detach", str(tree), "base")
    try:
        git(tree, "cherry-pick", "--no-edit", sha, identity="diffdx check <check@diffdx.local>")
        return "culprit alone on base"
    except GitError:  # the culprit needs an earlier commit: sweep the culprit commit itself
        git(tree, "cherry-pick", "--abort")
        git(tree, "checkout", "-q", "--detach", sha)
        return "culprit commit (with the history before it)"


def sweep_case(case: Case, out: Path, budget_min: float | None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"diffdx-check-{case.id}-") as tmp:
        repo = build_case_repo(case, Path(tmp) / "repo")
        tree = Path(tmp) / "tree"
        how = bug_alone(case, repo, tree)
        cmd = [sys.executable, "-m", "agent.check", "--engine", case.scenario.target.engine, "--target-source",
               str(tree), "--fail-fast", "--no-diagnose", "--quiet", "--out", str(out / case.id)]  # fmt: skip
        if budget_min:
            cmd += ["--budget-min", str(budget_min)]
        start = time.monotonic()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)  # `-m` from ROOT imports this checkout
        seconds = time.monotonic() - start
    row = {"case": case.id, "subject": case.subject, "tree": how, "exit": p.returncode, "seconds": round(seconds, 1)}
    results = out / case.id / "results.json"
    if results.exists():
        cells = json.loads(results.read_text())["cells"]
        failing = [c for c in cells if c["status"] in ("diverge", "error")]
        row.update(
            cells_run=sum(c["status"] != "skipped" for c in cells), caught_by=failing[0]["cell"] if failing else None
        )
        row["first_tap"] = failing[0]["first_tap"] if failing else None
    else:
        row.update(cells_run=0, caught_by=None, error=(p.stderr.strip().splitlines() or ["no output"])[-1])
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmark.check_cases", description=__doc__.split("\n\n")[0], epilog=EPILOG
    )
    ap.add_argument("ids", nargs="*", help="case ids (default: all)")
    ap.add_argument("--cases-dir", type=Path, help="benchmark cases (default: the bundled ones)")
    ap.add_argument("--budget-min", type=float, help="per-case time budget passed to agent.check")
    ap.add_argument("--out", type=Path, default=Path("out/check-cases"))
    args = ap.parse_args(argv)
    out = writable_dir(args.out)
    rows = []
    for case in load_cases(args.cases_dir, args.ids or None):
        row = sweep_case(case, out, args.budget_min)
        rows.append(row)
        print(
            f"{row['case']:<34} {'caught' if row['caught_by'] else 'MISSED':<7} {row['caught_by'] or row.get('error', '')}"
            f"  ({row['cells_run']} cells, {row['seconds']:.0f} s; {row['tree']})",
            flush=True,
        )
    caught = sum(bool(r["caught_by"]) for r in rows)
    print(f"caught {caught}/{len(rows)} cases with the default matrix")
    (out / "check_cases.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
