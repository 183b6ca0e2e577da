"""Does the default sweep catch each benchmark case's bug? `python -m benchmark.check_cases [ids or patterns]`.

For every case: build its repo, check out its bug alone (the culprit commit, whose history
holds no other bug; the base itself for a bug at base; the first bad release for a release history), and run
`agent.check --fail-fast --no-diagnose` with the default matrix (or --matrix) against that tree.
A case is caught when some cell fails. `--order repro` (the default) runs first the default cells
nearest the case's reported scenario (its repro.toml, as an issue gives it: arch, dtype, options,
config keys, workload shape; never its truth), so a budget reaches the cells that share its trigger;
`--order covering` keeps the blind covering order. A case that cannot be swept here gets an n/a
row with the reason (a release history unless --releases; a subject named by --skip-subject).
All cases are swept in this one process with one Prober,
so the reference runs (which depend on the tokens only, never on the tree under test) and the
worker zygote serve every case. Prints one row per case as it ends and the share caught; writes
`check_cases.json` under --out after every case. Nothing of the case's truth reaches the sweep:
it only chooses which tree to sweep.

    python -m benchmark.check_cases 'ts-*' --budget-min 3     # every tinyserve case, 3 minutes each
    python -m benchmark.check_cases --skip-subject llama.cpp --budget-min 2   # all but the native builds
    python -m benchmark.check_cases ts-prefix-hash-chain ts-int4-group-scales
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tomli_w

from benchmark.build import build_case_repo, git, read_commit_map
from benchmark.cases import Case, load_cases, load_truth
from tools.engines.runner import EngineRunError
from tools.errors import EPILOG, BadInput, run_cli, writable_dir


def bug_alone(case: Case, repo: Path, tree: Path) -> str:
    """Check out the case's bug as its only one into `tree`; says how. The culprit commit itself:
    every commit before it is good (benchmark.validate proves the truth commit the first bad one),
    while the culprit cherry-picked onto the base can leave the bug inert when it relies on an
    earlier commit's code (a detokenizer change that breaks only once another commit batches its
    updates)."""
    truth = load_truth(case)
    if truth.commit is None:
        git(repo, "worktree", "add", "-q", "--detach", str(tree), "base")
        return "base (bug at base)"
    sha = read_commit_map(repo)["patches"][truth.commit]["sha"]
    git(repo, "worktree", "add", "-q", "--detach", str(tree), sha)
    return (
        f"first bad release {truth.commit}" if case.releases is not None else "culprit commit (good history before it)"
    )


def good_parent(repo: Path, tree: Path, into: Path) -> Path | None:
    """The commit before the swept one, checked out into `into` (a bug at base has none: None)."""
    head = git(tree, "rev-parse", "HEAD")
    base = git(repo, "rev-parse", "base^{commit}")
    if head == base:
        return None
    git(repo, "worktree", "add", "-q", "--detach", str(into), f"{head}^")
    return into


def error_rule(prober, clean: Callable[[], Path | None], row: dict):
    """Which errored cell counts as a catch: one whose engine runs on the tree before the bug
    (same cell, same scenario) without error and agrees there. An engine that fails on the clean
    tree too (a refusal, a missing build) says nothing of the bug; the sweep goes on past it."""
    from tools.engines.runner import EngineRunError

    def stops(result, scenario) -> bool:
        if result.status != "error":
            return True
        good = clean()
        if good is None:
            why = "no tree before the bug to tell it from the engine's own failure"
        else:
            try:
                why = "the tree before the bug diverges there too" if prober.probe(scenario, good).diverged else ""
            except EngineRunError as e:
                why = f"the tree before the bug fails there too ({str(e).splitlines()[0][:120]})"
        if why:
            row.setdefault("errors_not_counted", []).append({"cell": result.cell.id, "why": why})
        return not why

    return stops


def sweep_case(case: Case, out: Path, args, prober) -> dict:
    """Sweep the case's bug alone -> its row (caught_by: the first cell that diverges, or errors
    where the tree before the bug does not; None: missed)."""
    from agent.check import check
    from agent.check import parse_args as check_args

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"diffdx-check-{case.id}-") as tmp:
        repo = build_case_repo(case, Path(tmp) / "repo")
        tree = Path(tmp) / "tree"
        how = bug_alone(case, repo, tree)
        parent: list[Path | None] = []

        def clean() -> Path | None:  # checked out the first time an errored cell asks
            if not parent:
                parent.append(good_parent(repo, tree, Path(tmp) / "before"))
            return parent[0]

        argv = ["--engine", case.scenario.target.engine, "--fail-fast", "--no-diagnose", "--minimize-probes", "0"]
        argv += ["--out", str(out / case.id)]  # caught or not is the question: no probes spent shrinking
        argv += ["--budget-min", str(args.budget_min)] if args.budget_min else []
        argv += ["--matrix", str(args.matrix)] if args.matrix else []
        if args.order == "repro":
            (Path(tmp) / "repro.toml").write_text(tomli_w.dumps(case.scenario.to_dict()))
            argv += ["--prefer", str(Path(tmp) / "repro.toml")]
        row: dict = {"case": case.id, "subject": case.subject, "tree": how}
        try:
            results, _, _, _ = check(
                check_args(argv),
                tree,
                writable_dir(out / case.id),
                prober,
                lambda m: args.log(f"{case.id} {m}"),
                stops=error_rule(prober, clean, row),
            )
        except (BadInput, EngineRunError) as e:  # the tree cannot be swept at all (its capabilities fail)
            results, row["error"] = [], str(e).splitlines()[0][:300]
    uncounted = {e["cell"] for e in row.get("errors_not_counted", [])}
    failing = [r for r in results if r.status == "diverge" or (r.status == "error" and r.cell.id not in uncounted)]
    row.update(
        verdict="caught" if failing else "missed",
        seconds=round(time.monotonic() - start, 1),
        cells_run=sum(r.status != "skipped" for r in results),
        caught_by=failing[0].cell.id if failing else None,
        first_tap=(failing[0].first_tap or failing[0].status) if failing else None,
    )
    return row


def not_applicable(case: Case, args) -> str | None:
    """Why the case is not swept here (None: it is)."""
    if args.skip_subject and case.subject in args.skip_subject:
        return f"subject {case.subject} skipped (--skip-subject): its trees build natively per case"
    if case.releases is not None and not args.releases:
        return "a release history: its bug is a published release (benchmark.release_sweep sweeps those; --releases)"
    return None


def na_row(case: Case, reason: str) -> dict:
    return {"case": case.id, "subject": case.subject, "verdict": "n/a", "reason": reason, "caught_by": None}


def select(cases_dir: Path | None, patterns: list[str], subjects: list[str] | None) -> list[Case]:
    """Cases whose id matches one of `patterns` (ids or shell patterns, none = all), of `subjects`."""
    cases = load_cases(cases_dir)
    chosen = [c for c in cases if not patterns or any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(c.id, p) for c in cases)]
    if unknown:
        raise BadInput(f"no case matches {', '.join(unknown)}")
    return [c for c in chosen if subjects is None or c.subject in subjects]


def main(argv: list[str] | None = None) -> int:
    from tools.engines.runner import end_cleanly
    from tools.probe.prober import Prober

    ap = argparse.ArgumentParser(
        prog="python -m benchmark.check_cases", description=__doc__.split("\n\n")[0], epilog=EPILOG
    )
    ap.add_argument("ids", nargs="*", help="case ids or shell patterns ('ts-*'; default: all)")
    ap.add_argument("--cases-dir", type=Path, help="benchmark cases (default: the bundled ones)")
    ap.add_argument("--subject", action="append", help="only cases of this subject (repeatable)")
    ap.add_argument("--budget-min", type=float, help="per-case time budget passed to agent.check")
    ap.add_argument("--matrix", type=Path, help="matrix file passed to agent.check (default: its default matrix)")
    ap.add_argument("--order", choices=("repro", "covering"), default="repro", help="cell order (default: repro)")
    ap.add_argument("--releases", action="store_true", help="also sweep release-history cases (first bad release)")
    ap.add_argument("--skip-subject", action="append", help="report this subject's cases n/a (repeatable)")
    ap.add_argument("--out", type=Path, default=Path("out/check-cases"))
    ap.add_argument("--quiet", action="store_true", help="no per-cell lines on stderr")
    args = ap.parse_args(argv)
    args.log = (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    end_cleanly(False)
    out = writable_dir(args.out)
    cases = select(args.cases_dir, args.ids, args.subject)
    rows: list[dict] = []
    prober = Prober()
    for case in cases:
        reason = not_applicable(case, args)
        row = na_row(case, reason) if reason else sweep_case(case, out, args, prober)
        rows.append(row)
        print(row_line(row), flush=True)
        (out / "check_cases.json").write_text(json.dumps(rows, indent=2) + "\n")
    swept = [r for r in rows if r["verdict"] != "n/a"]
    caught = sum(r["verdict"] == "caught" for r in rows)
    print(
        f"caught {caught}/{len(swept)} cases with the {'given' if args.matrix else 'default'} matrix"
        f" ({len(rows) - len(swept)} n/a, {args.order} order)"
    )
    return 0


def row_line(row: dict) -> str:
    if row["verdict"] == "n/a":
        return f"{row['case']:<34} n/a     {row['reason']}"
    return (
        f"{row['case']:<34} {'caught' if row['caught_by'] else 'MISSED':<7} {row['caught_by'] or row.get('error', '')}"
        f" {row['first_tap'] or ''}  ({row['cells_run']} cells, {row['seconds']:.0f} s; {row['tree']})"
    )


if __name__ == "__main__":
    sys.exit(run_cli(main))
