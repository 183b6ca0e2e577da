"""Tensor replacement (issue 13): re-run the target with the reference's activation injected at a tap.

If the divergence downstream of the tap disappears, the fault is upstream of the tap or at it;
if it stays, there is a fault after it (the first divergence that remains names the next one).
This confirms a first divergent tap (an amplified small error upstream would not vanish),
splits several bugs apart, and splits a layer into its sub-steps, with no history.

    python -m tools.probe.replace --scenario s.toml --tap layers.1.mlp.down [--tap …] [--target-source DIR] [--json]

Both runs are teacher-forced on the token sequences the reference ran, so every injected row
and every compared row belongs to the same tokens. A control run (nothing injected) shows the
divergence survives teacher forcing; without it no verdict is given. "Downstream" is every
tap after the last injected one in execution order. A tap off the residual stream (e.g.
`attn.q`) only fixes its own branch: inject at the first divergent tap, or at `layers.{i}.out`.

Exit status: 0 the divergence is gone downstream (fault at or before the tap), 1 it stays
(fault after the tap), 2 no verdict (bad input, engine failure, or no divergence to remove).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools.engines import engine_capabilities
from tools.engines.protocol import RunJob
from tools.engines.runner import EngineRunError, run_engine
from tools.probe import compare
from tools.probe import taps as tapnames
from tools.probe import trace as trace_io
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.prober import Prober, ProbeResult, compare_traces
from tools.probe.trace import Trace
from tools.scenario import Scenario, ScenarioError, load

UPSTREAM, DOWNSTREAM, NO_VERDICT = "upstream", "downstream", "no verdict"
# Taps everything after them is computed from (with the weights): an injection there cannot be
# bypassed. Any other tap is a branch; an upstream divergence can flow around it.
STREAM_TAPS = ("embed", "layers.*.resid_mid", "layers.*.out", "final_norm", "logits", "sampler.logits")


@dataclass
class Replacement:
    taps: list[str]  # where the reference's rows were injected
    control: ProbeResult  # the target teacher-forced, nothing injected
    replaced: ProbeResult  # the same run with the reference injected at `taps`
    injected_rows: dict[str, int]  # rows the target actually replaced, per tap

    @property
    def before(self) -> compare.Divergence | None:
        """First real divergence after the injection point, without the injection."""
        return downstream_divergence(self.control.stats, self.taps)

    @property
    def after(self) -> compare.Divergence | None:
        """First real divergence after the injection point, with it: the next fault, if any."""
        return downstream_divergence(self.replaced.stats, self.taps)

    @property
    def bypass(self) -> compare.Divergence | None:
        """A divergence before a branch tap that reaches downstream around it (then `after` says nothing)."""
        if all(tapnames.matches(t, STREAM_TAPS) for t in self.taps):
            return None
        cut = min(tapnames.order_key(t) for t in self.taps)
        return compare.first_divergence([s for s in self.replaced.stats if tapnames.order_key(s.tap) < cut])

    @property
    def verdict(self) -> str:
        if self.before is None:
            return NO_VERDICT
        if self.after is None:
            return UPSTREAM
        return NO_VERDICT if self.bypass is not None else DOWNSTREAM

    @property
    def summary(self) -> str:
        at = ", ".join(self.taps)
        before, after, bypass = self.before, self.after, self.bypass  # the cases of `verdict`
        if before is None:
            return f"no verdict: nothing diverges after {at} in the teacher-forced target"
        if after is None:
            return (
                f"injecting the reference at {at} removes the divergence downstream "
                f"(was {before.tap}, ratio {before.ratio:.3g}): the fault is at or before {at}"
            )
        if bypass is not None:
            return (
                f"no verdict: the divergence at {bypass.tap}, before {at}, reaches past it on the residual "
                f"stream; inject at the first divergent tap or at a layers.N.out"
            )
        return (
            f"the divergence stays after injecting at {at}: first at {after.tap} "
            f"(ratio {after.ratio:.3g}), so a fault lies after {at}"
        )

    def to_dict(self) -> dict:
        return {
            "taps": self.taps,
            "verdict": self.verdict,
            "summary": self.summary,
            "injected_rows": self.injected_rows,
            "before": self.before.to_dict() if self.before else None,
            "bypass": self.bypass.to_dict() if self.bypass else None,
            "after": self.after.to_dict() if self.after else None,
            "divergent_taps_after": self.replaced.divergent_taps,
            "engine_runs": self.control.engine_runs + self.replaced.engine_runs,
        }


def downstream_divergence(stats: list[compare.TapStat], taps: list[str]) -> compare.Divergence | None:
    """First real divergence among the taps that run after every tap in `taps` (execution order)."""
    cut = max(tapnames.order_key(t) for t in taps)
    return compare.first_divergence([s for s in stats if tapnames.order_key(s.tap) > cut])


def rows_at(reference: Trace, taps: list[str]) -> Trace:
    """The reference's rows at `taps`: what the target gets injected."""
    blocks = reference.blocks(taps)
    missing = sorted(set(taps) - {b.name for b in blocks})
    if missing:
        raise ValueError(f"the reference trace has no rows at {missing}")
    return Trace(engine=reference.engine, dtype=reference.dtype, outputs=reference.outputs, blocks=blocks)


def check_replaceable(scenario: Scenario, taps: list[str], target_source: Path | None = None) -> None:
    caps = engine_capabilities(scenario.target.engine, target_source)  # the tree under test's adapter
    bad = [t for t in taps if not tapnames.matches(t, caps.replace)]
    if bad:
        raise ValueError(
            f"{scenario.target.engine} cannot inject at {bad}; replaceable: {', '.join(caps.replace) or 'nothing'}"
        )


class Replacer:
    """Replacement runs of one scenario against one reference; the control run is shared.

    `reference` is the scenario's high-precision reference trace (what Prober.probe compares
    against); both target runs are teacher-forced on its sequences. The reference at the
    target's dtype comes from the prober (cached when the scenario was probed)."""

    def __init__(
        self,
        scenario: Scenario,
        reference: Trace,
        target_source: Path | None = None,
        prober: Prober | None = None,
        reference_source: Path | None = None,
    ):
        self.scenario, self.reference, self.source = scenario, reference, target_source
        self.prober = prober or Prober()
        self.reference_source = reference_source
        self._control: ProbeResult | None = None

    def control(self) -> ProbeResult:
        """The target teacher-forced with nothing injected: its first divergence is the one to split."""
        if self._control is None:
            self._control = self._compare(self._run(None))
        return self._control

    def at(self, taps: list[str] | str) -> Replacement:
        """Inject the reference's rows at `taps` (all at once) and compare again."""
        taps = [taps] if isinstance(taps, str) else list(taps)
        check_replaceable(self.scenario, taps, self.source)
        control = self.control()
        with tempfile.TemporaryDirectory(prefix="diffdx-replace-") as tmp:
            target = self._run(str(trace_io.save(rows_at(self.reference, taps), Path(tmp) / "rows")))
        replaced_rows = target.meta.get("replaced_rows", {})
        untouched = [t for t in taps if not replaced_rows.get(t)]
        if untouched:
            raise ValueError(f"the target computed no row the reference has at {untouched}")
        return Replacement(taps, control, self._compare(target), replaced_rows)

    def _compare(self, target: Trace) -> ProbeResult:
        sc, teacher = self.scenario, self.reference.sequences()
        low = (
            self.reference
            if sc.target.dtype == sc.reference.dtype
            else self.prober.run_reference(
                sc, sc.target.dtype, teacher, self.reference_source, weights=target.meta.get("weights")
            )
        )
        result = compare_traces(sc, target, low, self.reference)
        result.engine_runs = 1
        return result

    def _run(self, inject: str | None) -> Trace:
        sc = self.scenario
        job = RunJob(
            sc,
            sc.target,
            str(ensure_checkpoint(sc.model)),
            teacher=self.reference.sequences(),
            device=self.prober.device,
            replace=inject,
        )
        self.prober.engine_runs += 1
        return run_engine(job, self.source, timeout=self.prober.timeout)


def replace_at(
    scenario: Scenario,
    taps: list[str] | str,
    reference: Trace,
    target_source: Path | None = None,
    prober: Prober | None = None,
) -> Replacement:
    """One replacement: the target with `reference`'s rows injected at `taps`, and its control."""
    return Replacer(scenario, reference, target_source, prober).at(taps)


# ---- CLI -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.probe.replace", description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", required=True, type=Path)
    ap.add_argument("--tap", action="append", required=True, help="tap to inject the reference at (repeatable)")
    ap.add_argument("--target-source", type=Path, help="source tree under test (first on PYTHONPATH)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        sc = load(args.scenario)
        prober = Prober(device=args.device)
        probed = prober.probe(sc, args.target_source)
        assert probed.target is not None  # a probe keeps the target's trace
        weights = probed.target.meta.get("weights")
        reference = prober.run_reference(sc, sc.reference.dtype, probed.target.sequences(), None, weights=weights)
        result = replace_at(sc, args.tap, reference, args.target_source, prober)
    except (ScenarioError, EngineRunError, FileNotFoundError, ValueError) as e:
        print(f"replace failed: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.summary)
    return {UPSTREAM: 0, DOWNSTREAM: 1}.get(result.verdict, 2)


if __name__ == "__main__":
    sys.exit(main())
