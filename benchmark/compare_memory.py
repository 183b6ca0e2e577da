"""Peak memory of the compare step against the number of layers (issue 14 asks for a flat line).

    python -m benchmark.compare_memory [--scenario S.toml] [--layers 2 4 8]

For each layer count: the scenario's model with that many layers, one probe's three engine runs
(target, reference at high precision, reference at the target's dtype), their traces saved; then,
in a fresh process, the compare step alone (load the three traces, align and compare every tap),
whose peak RSS above the process's RSS before loading is reported. One row per layer count, and the
growth of the last over the first: 1.0 is memory independent of depth, the layer ratio is linear.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmark.probe_cost import DEFAULT_SCENARIO


def capture(scenario_path: Path, layers: int, folder: Path) -> None:
    """The three traces of one probe of the scenario's model at `layers` layers, saved under `folder`."""
    from tools.probe import trace as trace_io
    from tools.probe.prober import Prober
    from tools.scenario import from_dict, load

    data = load(scenario_path).to_dict()
    data["model"] = {**data["model"], "num_hidden_layers": layers}
    scenario = from_dict(data)
    prober = Prober()
    target = prober.run_target(scenario, None)
    teacher, weights = target.sequences(), target.meta.get("weights")
    high = prober.run_reference(scenario, scenario.reference.dtype, teacher, None, weights=weights)
    low = prober.run_reference(scenario, scenario.target.dtype, teacher, None, weights=weights)
    for name, trace in (("target", target), ("high", high), ("low", low)):
        trace_io.save(trace, folder / name)
    (folder / "scenario.json").write_text(json.dumps(data))


def measure(folder: Path) -> dict:
    """In this (fresh) process: the compare step's peak RSS in MiB above the RSS before it began."""
    from tools.probe import trace as trace_io
    from tools.probe.prober import compare_traces
    from tools.scenario import from_dict

    before = rss_mib()
    scenario = from_dict(json.loads((folder / "scenario.json").read_text()))
    target, high, low = (trace_io.load(folder / name) for name in ("target", "high", "low"))
    result = compare_traces(scenario, target, low, high)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    taps = len(target.records)
    return {
        "before_mib": round(before, 1),
        "peak_mib": round(peak, 1),
        "step_mib": round(peak - before, 1),
        "tap_records": taps,
        "diverged": result.diverged,
    }


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.compare_memory", description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO)
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the fresh process's side
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="diffdx-compare-memory-") as tmp:
        for layers in args.layers:
            folder = Path(tmp) / str(layers)
            capture(args.scenario, layers, folder)
            cmd = [sys.executable, "-m", "benchmark.compare_memory", "--measure", str(folder)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rows.append({"layers": layers, **json.loads(out)})
            print(json.dumps(rows[-1]), flush=True)
    growth = rows[-1]["step_mib"] / max(rows[0]["step_mib"], 1e-9)
    print(json.dumps({"scenario": str(args.scenario), "step_growth_last_over_first": round(growth, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
