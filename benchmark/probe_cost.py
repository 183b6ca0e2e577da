"""What capturing and comparing every tap costs, as a ratio to plain runs of the same engines.

    python -m benchmark.probe_cost [--scenario S.toml] [--repeats 5]

Both arms run the same three engine processes (target, reference at high precision,
reference at the target's dtype), interleaved round by round so that machine noise hits
both alike: the plain arm captures no taps (outputs only), the probe arm captures every
tap, writes and reloads the traces, aligns and compares them. Medians are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tools.probe.prober import Prober, compare_traces
from tools.scenario import load

DEFAULT_SCENARIO = Path(__file__).parent / "scenarios" / "tinyserve-batch.toml"


def one_round(scenario, taps) -> float:
    """Seconds for target + two teacher-forced reference runs (+ comparison when taps are on)."""
    prober = Prober()
    start = time.perf_counter()
    target = prober.run_target(scenario, None, taps=taps)
    teacher, weights = target.sequences(), target.meta.get("weights")
    high = prober.run_reference(scenario, scenario.reference.dtype, teacher, None, taps=taps, weights=weights)
    low = prober.run_reference(scenario, scenario.target.dtype, teacher, None, taps=taps, weights=weights)
    if taps is None:
        compare_traces(scenario, target, low, high)
    return time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.probe_cost", description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    scenario = load(args.scenario)
    one_round(scenario, None)  # warm the checkpoint cache and the OS file cache
    plain, probe = [], []
    for _ in range(args.repeats):
        plain.append(one_round(scenario, []))
        probe.append(one_round(scenario, None))
    p, q = statistics.median(plain), statistics.median(probe)
    print(
        json.dumps(
            {
                "scenario": str(args.scenario),
                "repeats": args.repeats,
                "plain_median_s": round(p, 2),
                "probe_median_s": round(q, 2),
                "ratio": round(q / p, 2),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
