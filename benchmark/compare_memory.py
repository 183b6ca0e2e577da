"""Peak memory of the compare step against the number of layers (issue 14 asks for a flat line).

    python -m benchmark.compare_memory [--scenario S.toml] [--layers 4 8 16] [--hidden 256]

For each layer count: the scenario's model with that many layers (and `--hidden` wide), one probe's
three engine runs (target, reference at high precision, reference at the target's dtype), their
traces saved; then, in a fresh process each, the compare step alone (load the three traces, align
and compare every tap), whose peak RSS above the process's RSS before loading is reported: streaming
(traces read lazily, one tap at a time) and eager (traces loaded whole), side by side. One row per
layer count, and the growth of the last over the first: 1.0 is memory independent of depth, the
layer ratio is linear.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmark.probe_cost import DEFAULT_SCENARIO


def capture(scenario_path: Path, layers: int, hidden: int | None, folder: Path) -> None:
    """The three traces of one probe of the scenario's model at `layers` layers, saved under `folder`."""
    from tools.probe import trace as trace_io
    from tools.probe.prober import Prober
    from tools.scenario import from_dict, load

    data = load(scenario_path).to_dict()
    data["model"] = {**data["model"], "num_hidden_layers": layers, **(width(hidden) if hidden else {})}
    scenario = from_dict(data)
    prober = Prober()
    target = prober.run_target(scenario, None)
    teacher, weights = target.sequences(), target.meta.get("weights")
    high = prober.run_reference(scenario, scenario.reference.dtype, teacher, None, weights=weights)
    low = prober.run_reference(scenario, scenario.target.dtype, teacher, None, weights=weights)
    for name, trace in (("target", target), ("high", high), ("low", low)):
        trace_io.save(trace, folder / name)
    (folder / "scenario.json").write_text(json.dumps(data))


def width(hidden: int) -> dict:
    """[model] keys of a `hidden`-wide model with heads of 16 (the tiny presets' head_dim)."""
    return {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": hidden // 16,
        "num_key_value_heads": hidden // 32,
    }


def measure(folder: Path, lazy: bool) -> dict:
    """In this (fresh) process: the compare step's peak RSS in MiB above the RSS before it began."""
    from tools.probe import trace as trace_io
    from tools.probe.prober import compare_traces
    from tools.scenario import from_dict

    before = rss_mib()
    reset_peak()
    scenario = from_dict(json.loads((folder / "scenario.json").read_text()))
    target, high, low = (trace_io.load(folder / name, lazy=lazy) for name in ("target", "high", "low"))
    result = compare_traces(scenario, target, low, high)
    peak = rss_mib("VmHWM:")
    return {
        "step_mib": round(peak - before, 1),
        "before_mib": round(before, 1),
        "tap_records": sum(len(b.table) for b in target.blocks()),  # read after the peak: not part of the step
        "tap_blocks": len(target.blocks()),
        "diverged": result.diverged,
        "first": result.first.tap if result.first else None,
    }


def trace_mib(folder: Path) -> float:
    return round(sum(f.stat().st_size for f in folder.glob("*/taps.safetensors")) / 2**20, 1)


def measure_fresh(folder: Path, mode: str) -> dict:
    cmd = [sys.executable, "-m", "benchmark.compare_memory", "--measure", str(folder), "--mode", mode]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def rss_mib(field: str = "VmRSS:") -> float:
    """This process's resident set (or, `VmHWM:`, its peak) in MiB. Not `getrusage`'s ru_maxrss: it
    survives fork and exec, so a child started by a large parent reports the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak() -> None:
    """Start VmHWM afresh from the current RSS (Linux >= 4.0), so the peak is the step's own."""
    Path("/proc/self/clear_refs").write_text("5")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.compare_memory", description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--hidden", type=int, help="hidden size (default: the scenario's), a multiple of 32")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the fresh process's side
    ap.add_argument("--mode", choices=["stream", "eager"], default="stream", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, lazy=args.mode == "stream")))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="diffdx-compare-memory-") as tmp:
        for layers in args.layers:
            folder = Path(tmp) / str(layers)
            capture(args.scenario, layers, args.hidden, folder)
            stream, eager = measure_fresh(folder, "stream"), measure_fresh(folder, "eager")
            assert stream["first"] == eager["first"] and stream["diverged"] == eager["diverged"]
            row = {"layers": layers, "trace_mib": trace_mib(folder), "stream_mib": stream["step_mib"]}
            rows.append(
                {
                    **row,
                    "eager_mib": eager["step_mib"],
                    "tap_records": stream["tap_records"],
                    "tap_blocks": stream["tap_blocks"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    growth = {
        f"{m}_growth_last_over_first": round(rows[-1][m] / max(rows[0][m], 1e-9), 2)
        for m in ("stream_mib", "eager_mib")
    }
    print(json.dumps({"scenario": str(args.scenario), "hidden": args.hidden, **growth}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
