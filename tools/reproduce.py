"""Reproduce: probe the scenario as given; if the engines agree, search the axes that hide bugs.

Real silent bugs hide behind a trigger: a batch of two or more, a prefix-cache hit, a chunk
boundary, a length past a window, a dtype, a sampling parameter. Variants are tried cheapest
first, within a run budget; the first that diverges *as the issue describes* becomes the
scenario from then on. A variant that switches on a feature the issue never mentions (sampling,
penalties, prefix caching, …) and diverges is a side finding, not a reproduction: it is recorded
and the search goes on; only when nothing on-issue diverges is the first side finding diagnosed,
marked `on_issue = False`, so the report cannot present it as the user's bug.
Then precision escalation (DESIGN §3): a bf16/fp16 divergence is re-run in fp32, where a
logic bug persists (and localizes sharply) and a precision bug vanishes.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tools import progress
from tools.engines import engine_capabilities
from tools.engines.protocol import Capabilities, TriggerAxis
from tools.engines.runner import EngineRunError
from tools.errors import BadInput
from tools.hypotheses.evidence import Reproduction, SideFinding, Trial
from tools.probe import taps as tapnames
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.prober import Prober, ProbeResult
from tools.scenario import Request, Scenario


@dataclass(frozen=True)
class Feature:
    """Something a variant switches on, so that its divergence can be matched against the issue."""

    name: str
    label: str  # as the report names it
    words: tuple[str, ...]  # as an issue writes it
    exercised: Callable[[Scenario], bool]  # the scenario as given already uses it


def _penalised(sc: Scenario) -> bool:
    return any(
        float(r.sampling.get("repetition_penalty", 1.0)) != 1.0
        or float(r.sampling.get("presence_penalty", 0.0)) != 0.0
        or float(r.sampling.get("frequency_penalty", 0.0)) != 0.0
        for r in sc.requests
    )


# Features of any engine's requests, with the words an issue uses for each (matched on lower-cased
# text with `_` and `-` read as spaces). Engine features (prefix caching, chunked prefill, …) come
# from the engine's adapter, as Capabilities.trigger_axes, resolved against the tree under test.
SAMPLING_FEATURES = {
    "penalties": Feature("penalties", "penalties", ("penalt", "repetition", "presence", "frequency"), _penalised),
    "sampling": Feature(
        "sampling",
        "sampled requests",
        ("temperature", "top k", "top p", "min p", "sampling", "sampled", "nucleus", "do sample"),
        lambda sc: any(not r.greedy for r in sc.requests),
    ),
}


def axis_feature(axis: TriggerAxis, caps: Capabilities) -> Feature:
    """An engine's trigger axis as a Feature: used already when the scenario sets the axis's first
    option (to a true value when the axis switches it on with True), under any of its aliases."""
    key, on = next(iter(axis.options.items()))

    def exercised(sc: Scenario) -> bool:
        opts = caps.canonical_options(sc.target.options)
        return bool(opts.get(key)) if on is True else key in opts

    return Feature(axis.name, axis.label, axis.words, exercised)


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    apply: Callable[[Scenario, int], Scenario]  # (scenario, vocab size) -> variant
    features: tuple[Feature, ...] = ()  # what it switches on (none: workload only)


Found = tuple[Scenario, ProbeResult]  # a scenario whose probe diverges, with that probe


def _prompt(req: Request, vocab: int, seed: int, length: int | None = None) -> list[int]:
    """Deterministic ids for extra requests; reuse the request's own ids when it has them."""
    rng = random.Random(seed)
    base = list(req.prompt_ids) if req.prompt_ids else [rng.randrange(3, vocab) for _ in range(24)]
    length = length or len(base)
    while len(base) < length:
        base.append(rng.randrange(3, vocab))
    return base[:length]


def _with_requests(sc: Scenario, reqs: list[Request]) -> Scenario:
    return sc.with_requests(reqs)


def _batch(sc: Scenario, vocab: int) -> Scenario:
    first = sc.requests[0]
    extra = [replace(first, prompt=None, prompt_ids=tuple(_prompt(first, vocab, i, 12 + 9 * i))) for i in range(1, 4)]
    return _with_requests(sc, list(sc.requests) + extra)


def _shared_prefix(sc: Scenario, vocab: int) -> Scenario:
    first = sc.requests[0]
    ids = _prompt(first, vocab, 7, 40)
    again = [
        replace(
            first, prompt=None, prompt_ids=tuple(ids[:36] + _prompt(first, vocab, 8 + i, 6)[:6]), arrival_step=2 + 2 * i
        )
        for i in range(2)
    ]
    return _with_requests(sc, [replace(first, prompt=None, prompt_ids=tuple(ids))] + again)


def _long_prompt(sc: Scenario, vocab: int) -> Scenario:
    first = sc.requests[0]
    return _with_requests(
        sc, [replace(first, prompt=None, prompt_ids=tuple(_prompt(first, vocab, 3, 90)))] + list(sc.requests[1:])
    )


def _long_generation(sc: Scenario, _vocab: int) -> Scenario:
    return _with_requests(
        sc,
        [
            replace(r, max_tokens=max(r.max_tokens, 48), sampling={**r.sampling, "ignore_eos": True})
            for r in sc.requests
        ],
    )


def _staggered(sc: Scenario, vocab: int) -> Scenario:
    batch = _batch(sc, vocab)
    return _with_requests(sc, [replace(r, arrival_step=3 * i) for i, r in enumerate(batch.requests)])


def _sampling(**params: Any) -> Callable[[Scenario, int], Scenario]:
    def apply(sc: Scenario, vocab: int) -> Scenario:
        batch = _batch(sc, vocab)
        return _with_requests(sc, [replace(r, sampling={**r.sampling, **params}) for r in batch.requests])

    return apply


def _options(**opts: Any) -> Callable[[Scenario, int], Scenario]:
    def apply(sc: Scenario, _vocab: int) -> Scenario:
        return sc.with_target(options={**sc.target.options, **opts})

    return apply


def _then(*steps: Callable[[Scenario, int], Scenario]) -> Callable[[Scenario, int], Scenario]:
    def apply(sc: Scenario, vocab: int) -> Scenario:
        for step in steps:
            sc = step(sc, vocab)
        return sc

    return apply


# Workload shapes an engine's trigger axis names (TriggerAxis.workload), applied after its options.
WORKLOADS = {"": (), "shared_prefix": (_shared_prefix,), "long_prompt": (_long_prompt,), "batch": (_batch,)}


def engine_capabilities_or_none(scenario: Scenario, target_source: Path | None) -> Capabilities | None:
    """The target engine's capabilities in the tree under test; None when they cannot be had (a
    tree that does not import is then found by the probe itself, as an engine run failure)."""
    try:
        return engine_capabilities(scenario.target.engine, target_source)
    except (EngineRunError, BadInput):
        return None


def variants(scenario: Scenario, target_source: Path | None = None) -> list[Variant]:
    """Variants for this scenario's target engine (its trigger axes, as the tree under test
    declares them), cheapest first."""
    caps = engine_capabilities_or_none(scenario, target_source)
    arch = scenario.model.get("arch")  # a checkpoint dir: its arch is unknown here, every axis is tried
    runs = [a for a in caps.trigger_axes if not a.archs or arch is None or arch in a.archs] if caps else []
    axes = [(a, axis_feature(a, caps)) for a in runs] if caps is not None else []
    out = [
        Variant("batch", "a batch of 4 requests of different lengths", _batch),
        Variant("long_prompt", "a 90-token prompt (past windows, blocks and chunks)", _long_prompt),
        Variant("long_generation", "48 generated tokens", _long_generation),
        Variant("staggered", "4 requests arriving at different steps", _staggered),
    ]
    out += [
        Variant(a.name, a.description, _then(_options(**a.options), *WORKLOADS[a.workload]), (feature,))
        for a, feature in axes
    ]
    out += [
        Variant(
            "penalties",
            "repetition / presence / frequency penalties in a batch",
            _sampling(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3),
            (SAMPLING_FEATURES["penalties"],),
        ),
        Variant(
            "sampling",
            "temperature 0.8 with top-k / top-p / min-p, seeded",
            _sampling(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, seed=11),
            (SAMPLING_FEATURES["sampling"],),
        ),
    ]
    if axes:
        together = [(a, f) for a, f in axes if not a.alone]
        everything = {k: v for a, _ in together for k, v in a.options.items()}
        out.append(
            Variant(
                "everything",
                "all engine features on, batch, shared prefix, long prompts",
                _then(_options(**everything), _shared_prefix, _batch, _long_prompt),
                tuple(feature for _, feature in together),
            )
        )
    return out


# --- does a divergence match the issue? ------------------------------------------------------------


def mentioned(feature: Feature, issue_text: str) -> bool:
    text = re.sub(r"[_\-]+", " ", issue_text.lower())
    return any(word in text for word in feature.words)


def described(feature: Feature, sc: Scenario, issue_text: str) -> bool:
    return feature.exercised(sc) or mentioned(feature, issue_text)


def off_issue(variant: Variant, given: Scenario, issue_text: str, result: ProbeResult) -> str | None:
    """Why `variant`'s divergence is not the one the issue describes, or None when it is. Pure.

    Off the issue: the variant switched on only features that neither the issue's text nor its
    scenario mention, or it diverges in the sampler while the issue has no sampled or penalised request."""
    new = [f for f in variant.features if not described(f, given, issue_text)]
    if variant.features and len(new) == len(variant.features):
        names = " / ".join(f.label for f in new)
        return f"the issue does not mention {names}, which this variant switched on"
    tap = result.first.tap if result.first is not None else "sampler.token"
    if tapnames.component(tap) == "sampler" and not any(
        described(f, given, issue_text) for f in SAMPLING_FEATURES.values()
    ):
        return f"it diverges in the sampler ({tap}), and the issue has no sampled or penalised request"
    return None


def variant_names(scenario: Scenario, target_source: Path | None = None) -> list[tuple[str, str]]:
    return [(v.name, v.description) for v in variants(scenario, target_source)]


def vocab_size(scenario: Scenario) -> int:
    config = json.loads((ensure_checkpoint(scenario.model) / "config.json").read_text())
    return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size", 512))


def reproduce(
    scenario: Scenario,
    prober: Prober,
    target_source: Path | None,
    *,
    budget_runs: int = 24,
    order: list[str] | None = None,
    issue_text: str | None = None,
) -> Reproduction:
    """Scenario -> Reproduction: as given first, then variants in order, then precision escalation.

    With `issue_text` (the report; "" for a bare repro), a variant's divergence the issue does not
    describe is a side finding (see `off_issue`): the search goes on, and the first side finding is
    diagnosed (`on_issue = False`) only when nothing on-issue diverges. None: no judgement."""
    start = prober.engine_runs
    trials: list[Trial] = []
    found = _try(scenario, "as given", prober, target_source, trials)
    trigger, side = "", []
    if found is None:
        vocab = vocab_size(scenario)
        for v in progress.each(
            _ordered(variants(scenario, target_source), order), "trigger variants", lambda v: v.name
        ):
            if prober.engine_runs - start >= budget_runs:
                break
            found = _try(v.apply(scenario, vocab), v.description, prober, target_source, trials)
            why = off_issue(v, scenario, issue_text, found[1]) if found and issue_text is not None else None
            if found is not None and why:
                trials[-1].off_issue = why
                side.append((found, SideFinding(v.description, why, found[1].summary, _first(found[1]))))
                found = None
            elif found is not None:
                trigger = v.description
                break
    return _conclude(scenario, found, trigger, side, trials, prober, target_source)


def _first(result: ProbeResult) -> dict | None:
    return result.first.to_dict() if result.first is not None else None


def _conclude(
    scenario: Scenario,
    found: Found | None,
    trigger: str,
    side: list[tuple[Found, SideFinding]],
    trials: list[Trial],
    prober: Prober,
    target_source: Path | None,
) -> Reproduction:
    """The reproduction to diagnose: the on-issue one, else the first side finding, else none."""
    findings = [f for _, f in side]
    on_issue = found is not None
    if found is None and side:
        found, trigger = side[0][0], side[0][1].trigger
    if found is None:
        error = next((t.summary for t in trials if t.summary.startswith("engine run failed")), None)
        return Reproduction(False, scenario, None, trials, None, None, error, side_findings=findings)
    sc, result = found
    repro = Reproduction(
        True,
        sc,
        result,
        trials,
        trigger,
        baseline=scenario if trigger else None,
        on_issue=on_issue,
        side_findings=findings,
    )
    return escalate(repro, prober, target_source, trials)


def _ordered(vs: list[Variant], order: list[str] | None) -> list[Variant]:
    if not order:
        return vs
    rank = {name: i for i, name in enumerate(order)}
    return sorted(vs, key=lambda v: rank.get(v.name, len(rank)))


def _try(sc: Scenario, description: str, prober: Prober, source: Path | None, trials: list[Trial]) -> Found | None:
    before = prober.engine_runs
    try:
        result = prober.probe(sc, source)
    except EngineRunError as e:
        trials.append(
            Trial(description, False, f"engine run failed: {e}", prober.engine_runs - before, dtype=sc.target.dtype)
        )
        return None
    trials.append(
        Trial(description, result.diverged, result.summary, prober.engine_runs - before, dtype=sc.target.dtype)
    )
    return (sc, result) if result.diverged else None


def escalate(repro: Reproduction, prober: Prober, source: Path | None, trials: list[Trial]) -> Reproduction:
    """bf16/fp16 divergence -> re-run in fp32: logic bug (persists) or precision bug (vanishes)."""
    if repro.scenario.target.dtype not in ("bfloat16", "float16"):
        repro.precision = "logic"
        return repro
    wide = repro.scenario.with_target(dtype="float32")
    found = _try(wide, "the same in float32 (precision escalation)", prober, source, trials)
    if found is None:
        repro.precision = "precision"
        return repro
    repro.scenario, repro.probe, repro.precision = wide, found[1], "logic"
    return repro
