"""Ablations of the full pipeline (issue 12 item 5): the same graph and scorer with one part off.

    taps       the probe reads output-level taps only (logits, sampler): no localization inside the
               model, so drill-down and source evidence see only "the output differs"
    drilldown  localization kept (first divergent tap, pattern), but no kernel swapped for its twin
    coverage   no function-coverage runs: candidates are not filtered by what the failing scenario ran
    bisect     no bisection, even when the reporter names a good ref

Chosen with `benchmark.run --ablate taps,bisect`; each diagnosis gets them in its config (`ablate`).
Every switch wraps a stage of agent.nodes.ToolStages; the pipeline itself is unchanged.
"""

from __future__ import annotations

from pathlib import Path

from agent.config import RunConfig
from agent.nodes import ToolStages
from benchmark.baselines import OUTPUT_TAPS

ABLATIONS = ("taps", "drilldown", "coverage", "bisect")


def parse_ablations(text: str) -> tuple[str, ...]:
    """'taps,bisect' -> ('bisect', 'taps'); unknown names raise ValueError listing the known ones."""
    names = tuple(sorted({n.strip() for n in text.split(",") if n.strip()}))
    unknown = [n for n in names if n not in ABLATIONS]
    if unknown:
        raise ValueError(f"unknown ablation {', '.join(unknown)}; known: {', '.join(ABLATIONS)}")
    return names


def output_taps(taps):
    """Any tap request -> output-level taps only; [] (a coverage-only run) stays []."""
    return taps if taps == [] else list(OUTPUT_TAPS)


class OutputTapsProber:
    """A Prober that never captures internal taps; engine runs count on the wrapped one."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def probe(self, scenario, target_source=None, reference_source=None, taps=None, **kw):
        return self._inner.probe(scenario, target_source, reference_source, output_taps(taps), **kw)

    def run_target(self, scenario, source, taps=None, **kw):
        return self._inner.run_target(scenario, source, taps=output_taps(taps), **kw)

    def run_reference(self, scenario, dtype, teacher, source, taps=None, **kw):
        return self._inner.run_reference(scenario, dtype, teacher, source, taps=output_taps(taps), **kw)


class AblatedStages(ToolStages):
    """ToolStages with the parts named in `off` switched off."""

    def __init__(self, off: tuple[str, ...]):
        self.off = parse_ablations(",".join(off))

    def _prober(self, prober):
        return OutputTapsProber(prober) if "taps" in self.off and prober is not None else prober

    def reproduce(self, scenario, prober, target_source, **kw):
        return super().reproduce(scenario, self._prober(prober), target_source, **kw)

    def drill_down(self, repro, prober, target_source):
        from tools.drilldown import drill_down

        return drill_down(repro, self._prober(prober), target_source, find_kernels="drilldown" not in self.off)

    def find_culprit(self, repo, good_ref, repro, prober):
        return None if "bisect" in self.off else super().find_culprit(repo, good_ref, repro, self._prober(prober))

    def hypothesize(self, repo, index, repro, drill, culprit, prober):
        # gather runs the coverage probes only when it is handed a prober
        keep = None if "coverage" in self.off else self._prober(prober)
        return super().hypothesize(repo, index, repro, drill, culprit, keep)

    def verify(self, repo, cands, repro, prober, culprit, top):
        return super().verify(repo, cands, repro, self._prober(prober), culprit, top)


def diagnose_ablated(case_input, out_dir: Path, config: RunConfig | None = None) -> dict:
    """benchmark.run's agent for `--ablate`: the full pipeline with the config's `ablate` parts off."""
    from agent.run import diagnose_case

    config = config or RunConfig()
    off = parse_ablations(",".join(config.ablate))
    report = diagnose_case(case_input, out_dir, config, stages=AblatedStages(off) if off else None)
    report["ablated"] = list(off)
    return report
