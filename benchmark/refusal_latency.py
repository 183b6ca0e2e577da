"""How long a bad scenario takes to be refused: each one run as a newcomer would, per tree, median of N.

    python -m benchmark.refusal_latency [--old DIR] [--repeats 3] [--cli probe|agent --target-source DIR] [--only NAME ...]

Each bad scenario (BAD below) is written to a temp file and run as a real subprocess,
`python -m tools.probe.prober --scenario FILE` (`--cli agent`: `python -m agent.run --issue-file
ISSUE --repro FILE --target-source DIR --llm none`), with PYTHONPATH set to the tree
being measured: this checkout and, with `--old DIR`, another (e.g. a detached worktree of main),
interleaved round by round so that machine noise hits both alike. Prints, per scenario and tree,
the exit code, the median wall time and the last stderr line; the load average is printed first and
last, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = """
[model]
arch = "llama"
[target]
engine = "tinyserve"
dtype = "float32"
[[workload.requests]]
prompt_ids = [1, 5, 9]
max_tokens = 4
"""
# name -> scenario text; every one must be refused (exit 2).
BAD = {
    "unknown top-level key": "typo = 1\n" + BASE,
    "wrong type (max_tokens)": BASE.replace("max_tokens = 4", 'max_tokens = "4"'),
    "bad dtype": BASE.replace('dtype = "float32"', 'dtype = "fp8"'),
    "unknown engine": BASE.replace('engine = "tinyserve"', 'engine = "vllm"'),
    "config key typo": BASE.replace('arch = "llama"', 'arch = "llama"\nnum_hidden_layer = 3'),
    "key another arch has": BASE.replace('arch = "llama"', 'arch = "llama"\nattn_logit_softcapping = 50.0'),
    "unhonoured sampling key": BASE.replace('engine = "tinyserve"', 'engine = "transformers"').replace(
        "max_tokens = 4", "max_tokens = 4\nsampling = { temperature = 0.7, presence_penalty = 0.5 }"
    ),
    "prompt past positions": BASE.replace("prompt_ids = [1, 5, 9]", 'prompt = "' + "word " * 1100 + '"'),
    "missing checkpoint path": BASE.replace('arch = "llama"', 'path = "/nonexistent/checkpoint"'),
}
ISSUE = "Greedy output differs from transformers.\n"


def command(cli: str, scenario: Path, tmp: Path, source: Path | None) -> list[str]:
    if cli == "probe":
        return [sys.executable, "-m", "tools.probe.prober", "--scenario", str(scenario), "--quiet"]
    issue = tmp / "issue.md"
    issue.write_text(ISSUE)
    return [
        *(sys.executable, "-m", "agent.run", "--issue-file", str(issue), "--repro", str(scenario)),
        *("--target-source", str(source), "--llm", "none", "--quiet", "--out", str(tmp / "out")),
    ]


def run_once(
    tree: Path, cli: str, scenario: Path, tmp: Path, timeout: float, source: Path | None = None
) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            command(cli, scenario, tmp, source), capture_output=True, text=True, cwd=tree, env=env, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return -1, time.perf_counter() - start, f"timed out after {timeout:.0f}s"
    lines = [line for line in proc.stderr.splitlines() if line.strip()] or ["(no stderr)"]
    return proc.returncode, time.perf_counter() - start, lines[-1]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.refusal_latency", description=__doc__.split("\n")[0])
    ap.add_argument("--old", type=Path, help="another diffdx tree to time side by side (e.g. main's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cli", choices=("probe", "agent"), default="probe")
    ap.add_argument(
        "--target-source", type=Path, help="with --cli agent: the tree under test (e.g. benchmark/subjects/tinyserve)"
    )
    ap.add_argument("--only", nargs="*", help="scenario names (substrings) to run; default all")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    if args.cli == "agent" and args.target_source is None:
        ap.error("--cli agent needs --target-source DIR")
    trees = {"new": ROOT} | ({"old": args.old.resolve()} if args.old else {})
    names = [n for n in BAD if not args.only or any(o in n for o in args.only)]
    print(f"load average before: {load()}  cli: {args.cli}  repeats: {args.repeats}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="diffdx-refusal-") as tmp_name:
        tmp = Path(tmp_name)
        for name in names:
            scenario = tmp / "s.toml"
            scenario.write_text(BAD[name])
            runs: dict[str, list[tuple[int, float, str]]] = {t: [] for t in trees}
            for _ in range(args.repeats):
                for label, tree in trees.items():
                    runs[label].append(run_once(tree, args.cli, scenario, tmp, args.timeout, args.target_source))
            for label in trees:
                codes = sorted({r[0] for r in runs[label]})
                median = statistics.median(r[1] for r in runs[label])
                rows.append((name, label, codes, median, runs[label][-1][2]))
                print(f"{name:26} {label:4} exit {codes} {median:6.1f}s  {runs[label][-1][2][:150]}", flush=True)
    print(f"load average after: {load()}")
    return 0 if all(codes == [2] for _, _, codes, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
