"""Where a diagnosis spends its time, and the old pipeline against the new one, side by side.

    python -m benchmark.perf stages CASE [--old]             per-stage wall time of one diagnosis
    python -m benchmark.perf compare CASE ... [--repeats N] [--old-ref REF]
                                                            median wall time per case, old vs new

`stages` runs the full agent on one bundled case in this process and splits its wall time by
graph node (reproduce, localize, drill_down, bisect, read_source, hypothesize, verify), and the
engine runs inside it by part: process start-up and imports, the engine itself (forward and
tap capture; coverage recording in the coverage runs), saving and loading traces; what is
left of a node beside its engine runs is in-process work (alignment and comparison, source
reading, git). `compare` runs `python -m benchmark.run CASE` once per arm and case, arms
interleaved so that load on the machine hits both alike, and reports each arm's median wall
time per subject, their ratio, and whether every diagnosis scored the same.

The old pipeline is DIFFDX_FORKSERVER=0 (a fresh `python -m` worker per run) and
DIFFDX_COVERAGE=profile (a `sys.setprofile` hook); the new one is the default. With `--old-ref REF`
the old pipeline is diffdx as committed at REF instead (a git worktree of this repo, removed at the
end, its own defaults), so that any change, not only a switch, is measured against its parent.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ARMS = {
    "old": {"DIFFDX_FORKSERVER": "0", "DIFFDX_COVERAGE": "profile"},
    "new": {"DIFFDX_FORKSERVER": "1", "DIFFDX_COVERAGE": "calls"},
}
RUN_PARTS = ("startup_s", "engine_s", "save_s", "load_s")
ROOT = Path(__file__).resolve().parents[1]


def stage_table(node_ends: list[tuple[str, float]], runs: list[dict], started: float) -> list[dict]:
    """Graph nodes (name, end time) and engine runs (JSON lines of DIFFDX_RUN_LOG) -> one row per
    node: its wall time, the engine runs that ended inside it, and their parts. Pure."""
    rows, begin = [], started
    for node, end in node_ends:
        inside = [r for r in runs if begin < r["end"] <= end]
        row = {
            "stage": node,
            "wall_s": end - begin,
            "engine_runs": len(inside),
            "runs_wall_s": sum(r["wall_s"] for r in inside),
            "coverage_runs": sum(r["coverage"] for r in inside),
        }
        row.update({part: sum(r.get(part, 0.0) for r in inside) for part in RUN_PARTS})
        row["in_process_s"] = row["wall_s"] - row["runs_wall_s"]
        rows.append(row)
        begin = end
    return rows


def stages(case_id: str) -> list[dict]:
    """Diagnose one bundled case here, timing each node and each engine run."""
    from agent.run import Inputs, RunConfig, diagnose
    from benchmark.build import build_case_repo
    from benchmark.cases import BUNDLED_CASES_DIR, case_input, load_case

    with tempfile.TemporaryDirectory(prefix="diffdx-perf-") as tmp:
        log = Path(tmp) / "runs.jsonl"
        os.environ["DIFFDX_RUN_LOG"] = str(log)
        case = load_case(BUNDLED_CASES_DIR / case_id)
        ci = case_input(case, build_case_repo(case, Path(tmp) / "repo"))
        ends: list[tuple[str, float]] = []
        started = time.time()
        diagnose(
            Inputs(str(ci.issue_number), ci.issue, ci.scenario, ci.repo, ci.repo),
            RunConfig(),
            Path(tmp) / "out",
            progress=lambda node, _update: ends.append((node, time.time())),
        )
        runs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        del os.environ["DIFFDX_RUN_LOG"]
    return stage_table(ends, runs, started)


def render_stages(rows: list[dict]) -> str:
    head = f"{'stage':<12}{'wall s':>8}{'runs':>6}{'start-up':>10}{'engine':>8}{'save+load':>11}{'in-process':>12}"
    lines = [head, "-" * len(head)]
    for r in rows + [total_row(rows)]:
        lines.append(
            f"{r['stage']:<12}{r['wall_s']:>8.1f}{r['engine_runs']:>6}{r['startup_s']:>10.1f}"
            f"{r['engine_s']:>8.1f}{r['save_s'] + r['load_s']:>11.2f}{r['in_process_s']:>12.1f}"
            + (f"  ({r['coverage_runs']} coverage)" if r["coverage_runs"] else "")
        )
    return "\n".join(lines)


def total_row(rows: list[dict]) -> dict:
    keys = ("wall_s", "engine_runs", "runs_wall_s", "coverage_runs", "in_process_s", *RUN_PARTS)
    return {"stage": "total", **{k: sum(r[k] for r in rows) for k in keys}}


def run_case(case_id: str, arm: str, out: Path, root: Path | None = None) -> dict:
    """`python -m benchmark.run CASE` under one arm -> wall time and score. `root`: the arm's own
    diffdx tree (cwd and PYTHONPATH), whose defaults it runs with; None: this one, with ARMS[arm]."""
    env = {**os.environ, **(ARMS[arm] if root is None else {"PYTHONPATH": str(root)})}
    cmd = [sys.executable, "-m", "benchmark.run", case_id, "--quiet", "--out", str(out.resolve())]
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
    wall = time.monotonic() - started
    results = json.loads((out / "results.json").read_text()) if proc.returncode == 0 else {}
    score = next((c for c in results.get("cases", []) if c.get("case") == case_id), {})
    return {
        "case": case_id,
        "arm": arm,
        "wall_s": wall,
        "rank": score.get("rank"),
        "pass_at_1": score.get("pass_at_1"),
        "error": proc.returncode != 0 or bool(score.get("errors")),
    }


def compare(case_ids: list[str], repeats: int, out: Path, old_ref: str | None = None) -> dict:
    """Each case under both arms, `repeats` times, the arms' order alternating; the old arm from a
    worktree at `old_ref` when given."""
    with old_tree(old_ref, out) as old_root:
        roots = {"old": old_root, "new": None if old_root is None else ROOT}
        rows = []
        for i in range(repeats):
            for case_id in case_ids:
                for arm in ("old", "new") if i % 2 == 0 else ("new", "old"):
                    rows.append(run_case(case_id, arm, out / f"{arm}-{i}" / case_id, roots[arm]))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result = summarize(rows)
    result["old"] = old_ref or " ".join(f"{k}={v}" for k, v in ARMS["old"].items())
    return result


@contextmanager
def old_tree(ref: str | None, out: Path, repo: Path = ROOT) -> Iterator[Path | None]:
    """A detached git worktree of `repo` at `ref` under `out` (None: no tree), removed afterwards."""
    if ref is None:
        yield None
        return
    from tools.history.gitrepo import run_git

    tree = (out / "old-tree").resolve()
    run_git(repo, "worktree", "add", "--detach", "--force", str(tree), ref)
    try:
        yield tree
    finally:
        run_git(repo, "worktree", "remove", "--force", str(tree))


def summarize(rows: list[dict]) -> dict:
    """Per subject (case-id prefix) and arm: median wall seconds; the new/old ratio; same scores? Pure."""
    out: dict = {"rows": rows, "subjects": {}}
    for subject in sorted({r["case"].split("-")[0] for r in rows}):
        med = {
            arm: statistics.median([r["wall_s"] for r in rows if r["arm"] == arm and r["case"].startswith(subject)])
            for arm in ARMS
        }
        out["subjects"][subject] = {
            "old_median_s": round(med["old"], 1),
            "new_median_s": round(med["new"], 1),
            "ratio": round(med["new"] / med["old"], 2),
        }
    ranks = {(r["case"], r["arm"]): (r["rank"], r["error"]) for r in rows}
    out["same_scores"] = all(ranks.get((c, "old")) == ranks.get((c, "new")) for c, _ in ranks)
    return out


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.perf", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stages", help="per-stage wall time of one diagnosis")
    st.add_argument("case")
    st.add_argument("--old", action="store_true", help="with the old pipeline's switches")
    cp = sub.add_parser("compare", help="median wall time per case, old vs new pipeline")
    cp.add_argument("cases", nargs="+")
    cp.add_argument("--repeats", type=int, default=1)
    cp.add_argument("--out", type=Path, default=Path("out") / "perf")
    cp.add_argument("--old-ref", help="the old arm is diffdx at this git ref (a worktree), not the old switches")
    args = ap.parse_args(argv)
    print(f"load average before: {load_average()} ({os.cpu_count()} cores)")
    if args.cmd == "stages":
        os.environ.update(ARMS["old" if args.old else "new"])
        print(render_stages(stages(args.case)))
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        result = compare(args.cases, args.repeats, args.out, args.old_ref)
        print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
        (args.out / "perf.json").write_text(json.dumps(result, indent=2))
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
