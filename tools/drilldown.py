"""Drill down: from the first divergent tap to the layer, the component and the kernel.

For engines with swappable kernels, the kernel is found by bisecting the set of kernels
swapped to their native twins (⌈log2 K⌉ + 1 probes): the divergence vanishes exactly when
the faulty kernel runs native. An engine without native twins that can judge its own graph ops
(Capabilities.op_checks) is run once more with every op compared against the same op recomputed in
fp64 from the inputs it was given: the first op over its tolerance, in graph order, computes wrong
(its downstream ops are given wrong inputs but compute right from them), and the adapter names the
function that computes it.
"""

from __future__ import annotations

from pathlib import Path

from tools.engines import engine_capabilities
from tools.engines.runner import EngineRunError
from tools.hypotheses.evidence import DrillDown, Reproduction
from tools.probe import compare
from tools.probe import taps as tapnames
from tools.probe.prober import Prober, ProbeResult


def divergence_pattern(result: ProbeResult, prompt_lengths: list[int]) -> dict:
    """Which requests, positions and steps diverge: the strongest clues. Pure."""
    f = result.first
    assert f is not None, "a pattern needs a first divergent tap"
    n_requests = len(prompt_lengths)
    decode_only = all(p >= min(prompt_lengths[r] for r in f.requests) for p in f.positions)
    return {
        "requests": f.requests,
        "all_requests": len(f.requests) == n_requests,
        "positions": compare.compress(f.positions),
        "from_position": min(f.positions),
        "steps": compare.compress(f.steps),
        "decode_only": decode_only,
        "prefill_only": max(f.steps) == 0 if f.steps else False,
        "nonfinite": f.nonfinite,
        "tokens": result.tokens,
    }


def describe(pattern: dict, tap: str) -> list[str]:
    lines = [f"first divergent tap {tap} ({tapnames.component(tap)})"]
    if not pattern["all_requests"]:
        lines.append(f"only requests {pattern['requests']} diverge")
    lines.append(f"diverging positions {pattern['positions']} (steps {pattern['steps']})")
    if pattern["decode_only"]:
        lines.append("only generated (decode) positions diverge; the prompt is computed right")
    if pattern["nonfinite"]:
        lines.append("the target produces inf/NaN where the reference is finite")
    return lines


def drill_down(repro: Reproduction, prober: Prober, target_source: Path | None, find_kernels: bool = True) -> DrillDown:
    result = repro.probe
    assert result is not None and result.target is not None, "drill down needs a probed reproduction"
    if result.first is None:  # tokens differ, no tap over threshold: the output itself is the clue
        return DrillDown("sampler.token", None, "sampler", evidence=[result.summary])
    tap = result.first.tap
    lengths = [len(o.prompt_ids) for o in result.target.outputs]
    pattern = divergence_pattern(result, lengths)
    drill = DrillDown(
        tap, tapnames.split(tap)[0], tapnames.component(tap), pattern=pattern, evidence=describe(pattern, tap)
    )
    if not find_kernels:  # ablation (benchmark/ablations.py): localize, but swap no kernels
        return drill
    before = prober.engine_runs
    drill.kernel = find_kernel(repro, prober, target_source, drill.evidence)
    if drill.kernel is None and _judges_ops(repro, target_source):
        drill.op = find_wrong_op(repro, prober, target_source, drill.evidence)
        drill.kernel = drill.op["op"] if drill.op else None
    drill.engine_runs = prober.engine_runs - before
    return drill


def find_kernel(repro: Reproduction, prober: Prober, source: Path | None, evidence: list[str]) -> str | None:
    """Bisect the swappable kernels with native twins; None when no kernel explains it."""
    try:
        kernels = list(engine_capabilities(repro.scenario.target.engine, source).kernels)  # the tree under test's
    except Exception as e:  # an adapter that cannot list kernels is not fatal
        evidence.append(f"kernel list unavailable: {e}")
        return None
    if not kernels:
        return None
    if _diverges(repro, prober, source, kernels):
        evidence.append(f"divergence persists with every kernel native ({', '.join(kernels)}): not a kernel")
        return None
    while len(kernels) > 1:
        half = kernels[: len(kernels) // 2]
        kernels = kernels[len(kernels) // 2 :] if _diverges(repro, prober, source, half) else half
    evidence.append(f"swapping kernel {kernels[0]} to its native twin removes the divergence")
    return kernels[0]


def _diverges(repro: Reproduction, prober: Prober, source: Path | None, native: list[str]) -> bool:
    try:
        return prober.probe(repro.scenario, source, native_kernels=native).diverged
    except EngineRunError:
        return True


def _judges_ops(repro: Reproduction, source: Path | None) -> bool:
    try:
        return engine_capabilities(repro.scenario.target.engine, source).op_checks
    except Exception:  # the kernel search said why already
        return False


def find_wrong_op(repro: Reproduction, prober: Prober, source: Path | None, evidence: list[str]) -> dict | None:
    """One target run judging every op on its own inputs -> the first wrong op (dict from the
    adapter: op, name, ratio, error, floor, file, function, callers), or None when every op is right."""
    try:
        checks = prober.run_target(repro.scenario, source, taps=[], op_checks=True).meta.get("op_checks") or {}
    except EngineRunError as e:
        evidence.append(f"op checks failed: {e}")
        return None
    if not checks.get("judged"):
        return None
    wrong = checks.get("wrong") or []
    if not wrong:
        evidence.append(f"every one of {checks['judged']} ops computes right from its own inputs: not a kernel")
        return None
    evidence.append(op_line(wrong[0], checks["judged"]))
    return wrong[0]


def op_line(op: dict, judged: int) -> str:
    where = f", computed by {op['function']} in {op['file']}" if op.get("function") else ""
    return (
        f"first op that computes wrong from its own inputs: {op['op']} (node {op['name'] or '?'}){where}: "
        f"error {op['error']:.3g} against its fp64 recompute, {op['ratio']:.3g}x its noise floor "
        f"({judged} ops judged in graph order)"
    )
