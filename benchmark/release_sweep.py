"""Sweep an engine's published releases with agent.check: `python -m benchmark.release_sweep VERSION...`.

Each release's wheel (benchmark.releases: fetched once into the diffdx cache, offline afterwards)
is unpacked into a temporary folder and swept as the target (`--target-source`) against the
reference, with the default matrix or `--matrix`. One Prober serves every release, so a reference
run is made once for all the releases whose tokens agree. Prints one row per release and writes
`release_sweep.json` (per release: cells run, divergent and errored cells, each divergence group
with its minimal scenario) under --out, after every release.

    python -m benchmark.release_sweep 4.38.2 4.40.2 4.48.0 --matrix sweep.toml --out out/releases
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmark.releases import ReleaseError, unpack_package, wheel_path
from tools.engines import DEFAULT_ENGINE
from tools.engines.runner import EngineRunError
from tools.errors import EPILOG, BadInput, run_cli, writable_dir
from tools.preflight import capabilities


def sweep_release(version: str, args, prober) -> dict:
    """Unpack the release, sweep it -> its row (the groups as results.json lists them)."""
    from agent.check import check
    from agent.check import parse_args as check_args

    package = args.package
    out = writable_dir(args.out / version)
    start = time.monotonic()
    row: dict = {"version": version}
    with tempfile.TemporaryDirectory(prefix=f"diffdx-release-{version}-") as tmp:
        try:
            unpack_package(wheel_path(package, version), package, Path(tmp))
            argv = ["--engine", args.engine, "--no-diagnose", "--out", str(out)]
            argv += ["--minimize-probes", str(args.minimize_probes)]
            argv += ["--matrix", str(args.matrix)] if args.matrix else []
            argv += ["--budget-min", str(args.budget_min)] if args.budget_min else []
            argv += ["--reference", args.reference] if args.reference else []
            results, _, _, left_out = check(
                check_args(argv), Path(tmp), out, prober, lambda m: args.log(f"{version} {m}")
            )
        except (ReleaseError, BadInput, EngineRunError) as e:
            row["not_swept"] = str(e).splitlines()[0][:300]
            results, left_out = [], []
    counts = {s: sum(r.status == s for r in results) for s in ("agree", "diverge", "error", "skipped")}
    groups = json.loads((out / "results.json").read_text())["groups"] if results else []
    row.update(seconds=round(time.monotonic() - start, 1), **counts, groups=groups)
    row["errored_cells"] = [{"cell": r.cell.id, "why": r.summary} for r in results if r.status == "error"]
    row["left_out"] = left_out  # what the release does not run (an arch it predates): not cells, not findings
    return row


def line(row: dict) -> str:
    if "not_swept" in row:
        return f"{row['version']:<10} not swept: {row['not_swept']}"
    taps = "; ".join(f"{g['tap']} ({len(g['cells'])} cells: {', '.join(g['cells'][:3])})" for g in row["groups"])
    return (
        f"{row['version']:<10} {row['agree'] + row['diverge'] + row['error']} cells: {row['diverge']} diverge, "
        f"{row['error']} errored ({row['seconds']:.0f} s)  {taps}"
        + (f"  [left out: {'; '.join(row['left_out'])}]" if row.get("left_out") else "")
    )


def main(argv: list[str] | None = None) -> int:
    from tools.engines.runner import end_cleanly
    from tools.probe.prober import Prober

    ap = argparse.ArgumentParser(
        prog="python -m benchmark.release_sweep", description=__doc__.split("\n\n")[0], epilog=EPILOG
    )
    ap.add_argument("versions", nargs="+", help="releases to sweep, e.g. 4.38.2 4.48.0")
    ap.add_argument("--engine", default=DEFAULT_ENGINE, help="ENGINE[:key=value,...] whose releases these are")
    ap.add_argument("--reference", help="reference engine (default: the scenario default)")
    ap.add_argument("--matrix", type=Path, help="matrix file passed to agent.check")
    ap.add_argument("--budget-min", type=float, help="per-release time budget passed to agent.check")
    ap.add_argument("--minimize-probes", type=int, default=3, help="probes per divergence group to shrink it")
    ap.add_argument("--out", type=Path, default=Path("out/release-sweep"))
    ap.add_argument("--quiet", action="store_true", help="no per-cell lines on stderr")
    args = ap.parse_args(argv)
    args.log = (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    end_cleanly(False)
    caps = capabilities(args.engine.partition(":")[0], None)  # what the installed copy declares
    args.package = caps.package if caps is not None else ""
    if not args.package:
        raise BadInput(f"engine {args.engine!r} names no package; its releases cannot be unpacked")
    args.out = writable_dir(args.out)
    prober, rows = Prober(), []
    for version in args.versions:
        rows.append(sweep_release(version, args, prober))
        print(line(rows[-1]), flush=True)
        (args.out / "release_sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
