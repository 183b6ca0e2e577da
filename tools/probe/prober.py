"""The probe: run target and reference on one scenario, compare taps, say where they part.

    python -m tools.probe.prober --scenario s.toml [--target transformers:bfloat16:attn_implementation=sdpa]
                          [--reference transformers:float32] [--target-source DIR] [--json] [--keep-temp]

Exit status: 0 the engines agree, 1 they diverge, 2 bad input (scenario, flag, path, tap
pattern), 3 environment failure (an engine process crashed or timed out); see tools/errors.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools import progress
from tools.engines.runner import EngineRun, EngineRunError, end_cleanly, run_engine, spare_core
from tools.errors import EPILOG, BadInput, run_cli
from tools.scenario import EngineSpec, Scenario, check_reference_dtype, load

if TYPE_CHECKING:  # these import torch: loaded where a run or a comparison needs them, so that the
    # command line refuses bad input (tools.preflight) in a fraction of a second, not after torch's import
    from tools.engines.protocol import RunJob
    from tools.probe import compare
    from tools.probe.draws import DrawTest
    from tools.probe.trace import Trace

TEXT_TAP = "detokenizer"  # pseudo-tap: the target's text is not the decoding of its own tokens
TEXT_MISMATCH_RATIO = 1e6  # a text mismatch has no error ratio; report one far above any threshold


@dataclass
class ProbeResult:
    dtype: str
    first: compare.Divergence | None
    tokens: dict[int, int]  # request -> first position with a wrong greedy token
    layers: list[tuple[str, float]]
    divergent_taps: list[str]
    engine_runs: int
    target: Trace | None = None
    stats: list[compare.TapStat] = field(default_factory=list, repr=False)
    texts: list[int] = field(default_factory=list)  # requests whose text differs (see text_divergence)
    draws: DrawTest | None = None  # the sampled tokens' uniformity test (None: no sampled request)

    @property
    def diverged(self) -> bool:
        return self.first is not None or bool(self.tokens) or bool(self.texts)

    @property
    def summary(self) -> str:
        if not self.diverged:
            agree = f"agree ({self.dtype}; max ratio {max((r for _, r in self.layers), default=0):.2f})"
            if self.draws is not None and self.draws.verdict == "undecided":  # say so rather than let "agree" cover it
                return f"{agree}; {self.draws.line()}"
            return agree
        if self.first is None:
            return f"tokens differ at {self.tokens} but no tap crosses the threshold"
        from tools.probe import compare
        from tools.probe.taps import DRAWS_TAP

        f = self.first
        if f.tap == DRAWS_TAP and self.draws is not None:
            return f"{self.draws.line()} (first at step {f.step})"
        return (
            f"first divergence at {f.tap} (step {f.step}, requests {f.requests}, "
            f"positions {compare.compress(f.positions)}, ratio {f.ratio:.3g})"
        )

    def to_dict(self) -> dict:
        return {
            "diverged": self.diverged,
            "dtype": self.dtype,
            "first_divergence": self.first.to_dict() if self.first else None,
            "first_divergence_steps": self.first.steps if self.first else [],
            "nonfinite": bool(self.first and self.first.nonfinite),
            "token_divergence": {str(k): v for k, v in self.tokens.items()},
            "layers": [[k, round(v, 3)] for k, v in self.layers],
            "divergent_taps": self.divergent_taps,
            "engine_runs": self.engine_runs,
            "text_divergence": self.texts,
            "draws": draws_dict(self.draws),
            "summary": self.summary,
        }


def draws_dict(test: DrawTest | None) -> dict | None:
    """The uniformity test of the drawn tokens as report.json keeps it (None: no sampled request)."""
    if test is None:
        return None
    return {
        "verdict": test.verdict,
        "p": test.p if test.verdict != "undecided" else None,
        "side": test.side if test.verdict == "reject" else None,
        "informative_draws": test.n,
        "mean_pit": round(test.mean, 4) if test.n else None,
        "coincidences": test.coincidences,  # same token as an earlier pooled request at the same step
        "coincidences_expected": round(test.expected, 4),
        "left_out_draws": test.skipped,
        "requests": test.requests,
        "requests_left_out": {str(r): why for r, why in test.left_out.items()},
        "line": test.line(),
    }


class Prober:
    """Runs probes; caches reference traces, which depend only on the token sequences."""

    def __init__(self, timeout: float = 600.0, device: str = "cpu"):
        self.timeout = timeout
        self.device = device
        self.engine_runs = 0
        self.runs: list[dict] = []  # what each engine run was: role, engine, dtype, source, imported from
        self._reference_cache: dict[str, Trace] = {}

    def run_target(self, scenario: Scenario, source: Path | None, **options: Any) -> Trace:
        """The target run, joined and logged; `options` are start_target's (`timeout`: seconds for this run,
        default the prober's)."""
        run = self.start_target(scenario, source, **options)
        with progress.task(f"engine run {self.engine_runs}: {run.job.spec.engine} {run.job.spec.dtype} (target)"):
            return self._logged("target", run.job, source, run.result())

    def start_target(
        self,
        scenario: Scenario,
        source: Path | None,
        *,
        taps=None,
        native_kernels=(),
        coverage: bool = False,
        function_checks: bool = False,
        timeout: float | None = None,
        op_checks: bool = False,
    ) -> EngineRun:
        """The target run, started; its line in `runs` is the caller's to log."""
        from tools.engines.protocol import RunJob, check_spec
        from tools.probe.checkpoints import ensure_checkpoint

        check_spec(scenario.target, self.device)  # an option the adapter cannot tap is refused before any engine starts
        job = RunJob(
            scenario,
            scenario.target,
            str(ensure_checkpoint(scenario.model)),
            taps=taps,
            device=self.device,
            native_kernels=list(native_kernels),
            coverage_root=str(source) if coverage and source else None,
            function_checks=str(source) if function_checks and source else None,
            op_checks=(str(source) if source else "") if op_checks else None,
        )
        self.engine_runs += 1
        return EngineRun(job, source, timeout=timeout or self.timeout)

    def run_engines(
        self,
        scenario: Scenario,
        target_source: Path | None = None,
        reference_source: Path | None = None,
        taps=None,
        native_kernels=(),
        coverage: bool = False,
        timeout: float | None = None,
    ) -> tuple[Trace, Trace, Trace]:
        """The probe's three runs -> (target, low, high): the target, then the references teacher-forced on its
        tokens, in the trusted dtype (high) and in the target's (low, the same run when they are one dtype).
        Where a worker leaves a core idle (runner.spare_core), the references start as soon as the target's worker
        has its outputs, while it writes its trace (its save, hundreds of MB for a real model, is off the critical
        path); else they wait for the target's run to end. The second reference starts once the first has its
        outputs: its start-up and loading, mostly one thread, run beside the first's save (measured on SmolLM2,
        two threads a worker: the references 3.6 -> 3.2 s). Either way the target is joined before
        anything reads its trace: a target that fails, during its save too, raises its EngineRunError as if
        the references had waited for it, and references run on its outputs are dropped (their folders too)."""
        run = self.start_target(
            scenario, target_source, taps=taps, native_kernels=native_kernels, coverage=coverage, timeout=timeout
        )
        cached = set(self._reference_cache)
        slot = len(self.runs)  # the target's line in `runs` comes before its references', as when it ran first
        started: list[tuple[str, EngineRun, str]] = []  # references started here: cache key, run, progress label
        try:
            with progress.task(f"engine run {self.engine_runs}: {run.job.spec.engine} {run.job.spec.dtype} (target)"):
                early = run.outputs() if spare_core() else run.result()
            teacher, weights = early.sequences(), early.meta.get("weights")
            high_dtype = scenario.reference.dtype  # float64 unless [reference] dtype says float32
            jobs = {
                dtype: self.reference_job(scenario, dtype, teacher, reference_source, taps=taps, weights=weights)
                for dtype in dict.fromkeys((high_dtype, scenario.target.dtype))
            }
            try:
                for key, job in jobs.values():
                    if key in self._reference_cache:
                        continue
                    if started:  # the previous reference's forward is done: this one starts up beside its save
                        _, previous, label = started[-1]
                        with progress.task(label):
                            previous.outputs()
                    if run.ended:
                        run.result()  # a target that failed meanwhile: no further reference on its outputs
                    self.engine_runs += 1
                    label = f"engine run {self.engine_runs}: {job.spec.engine} {job.spec.dtype} (reference)"
                    started.append((key, EngineRun(job, reference_source, timeout=timeout or self.timeout), label))
                for key, reference, label in started:
                    if run.ended:
                        run.result()  # a target that failed meanwhile: its references are given up
                    with progress.task(label):
                        trace = reference.result()
                    self._reference_cache[key] = self._logged("reference", reference.job, reference_source, trace)
            except EngineRunError:
                run.result()  # the target's own failure, when it failed too, is the one to report: it came first
                raise
            target = run.result()
        except BaseException:
            for _, reference, _ in started:
                reference.cancel()  # nothing for one already joined
            if run.joined:  # a reference failed (or the caller was interrupted) after a target that answered
                raise
            run.cancel()
            for key in set(self._reference_cache) - cached:
                del self._reference_cache[key]
            raise
        self._logged("target", run.job, target_source, target, slot)
        high, low = (self._reference_cache[jobs[d][0]] for d in (high_dtype, scenario.target.dtype))
        return target, low, high

    def run_reference(
        self,
        scenario: Scenario,
        dtype: str,
        teacher: list[list[int]],
        source: Path | None,
        *,
        timeout: float | None = None,
        **job: Any,
    ) -> Trace:
        """The reference run, once per prober and cache key; `job` are reference_job's (`taps`, `weights`);
        `timeout`: seconds for this run (default: the prober's)."""
        key, run = self.reference_job(scenario, dtype, teacher, source, **job)
        if key not in self._reference_cache:
            self.engine_runs += 1
            with progress.task(f"engine run {self.engine_runs}: {run.spec.engine} {dtype} (reference)"):
                trace = run_engine(run, source, timeout=timeout or self.timeout)
            self._reference_cache[key] = self._logged("reference", run, source, trace)
        return self._reference_cache[key]

    def reference_job(
        self,
        scenario: Scenario,
        dtype: str,
        teacher: list[list[int]],
        source: Path | None,
        *,
        taps=None,
        weights: dict | None = None,
    ) -> tuple[str, RunJob]:
        """A reference run's job and its key in the prober's cache of references:
        everything its trace depends on."""
        from tools.engines.protocol import RunJob
        from tools.probe import compare
        from tools.probe.checkpoints import reference_checkpoint

        spec = EngineSpec(scenario.reference.engine, dtype, scenario.reference.options)
        checkpoint = str(reference_checkpoint(scenario.model, weights))
        taps = reference_taps(taps)
        key = json.dumps(
            [
                spec.engine,
                dtype,
                spec.options,
                teacher,
                taps,
                str(source),
                checkpoint,
                [r.sampling for r in scenario.requests],
                str(compare.stored_precision(scenario.target.dtype)),  # the digits its trace keeps
            ],
            sort_keys=True,
            default=str,
        )
        return key, RunJob(scenario, spec, checkpoint, teacher=teacher, taps=taps, device=self.device)

    def _logged(self, role: str, job: RunJob, source: Path | None, trace: Trace, slot: int | None = None) -> Trace:
        """Record what ran (a failed run raises before this and is not a run that answered), at `slot` in `runs`
        (default: last)."""
        self.runs.insert(
            len(self.runs) if slot is None else slot,
            {
                "role": role,
                "engine": job.spec.engine,
                "dtype": job.spec.dtype,
                "source": str(source) if source else None,
                "imported": imported_from(trace.meta),
            },
        )
        return trace

    def probe(
        self,
        scenario: Scenario,
        target_source: Path | None = None,
        reference_source: Path | None = None,
        taps=None,
        native_kernels=(),
        coverage: bool = False,
        timeout: float | None = None,
    ) -> ProbeResult:
        """`timeout`: seconds for each engine run of this probe (default: the prober's)."""
        runs_before = self.engine_runs
        target, low, high = self.run_engines(
            scenario, target_source, reference_source, taps, native_kernels, coverage, timeout
        )
        result = compare_traces(scenario, target, low, high)
        result.engine_runs = self.engine_runs - runs_before
        return result


def reference_taps(taps: list[str] | None) -> list[str] | None:
    """What a reference run captures when `taps` are asked for: all of them but the taps judged as sampling
    (compare.SAMPLING_JUDGED). Those are judged on the target's rows against the reference sampler's bounds
    on the sampler input (tools.probe.sampler_taps), never on a reference's own: a reference's vocabulary-wide
    `sampler.probs` rows were a tenth of a probe's trace bytes, computed, copied and written for no reader.
    None (every tap) -> the canonical taps (tools.probe.taps) less those."""
    from tools.probe import compare
    from tools.probe import taps as tapnames

    if taps is None:
        return ["embed", "layers.*", *(t for t in tapnames.HEAD_TAPS if t not in compare.SAMPLING_JUDGED)]
    return [t for t in taps if t not in compare.SAMPLING_JUDGED]


def imported_from(meta: dict) -> str | None:
    """The engine package file the worker imported, as its adapter reports it (`source`, `<pkg>_file`)."""
    for key, value in meta.items():
        if (key == "source" or key.endswith("_file")) and isinstance(value, str):
            return value
    return None


def compare_traces(scenario: Scenario, target: Trace, low: Trace, high: Trace) -> ProbeResult:
    """Three traces of one scenario -> ProbeResult (pure apart from the traces it is given). Taps are
    compared one at a time and only their summaries kept: over lazily loaded traces
    (`trace.load(dir, lazy=True)`) the memory it needs does not grow with the number of layers."""
    from tools.probe import compare
    from tools.probe.align import iter_aligned
    from tools.probe.sampler_taps import sampler_judgement

    # an adapter may say its run is as coarse as a narrower dtype (llama.cpp quantizes activations
    # to 8 bits for quantized weights): its noise floor and token margin are that dtype's
    dtype = target.meta.get("noise_dtype") or scenario.target.dtype
    unfinite: list[tuple[str, int]] = []
    aligned = trusted_finite(iter_aligned(target, without_sampling_judged(low), high), unfinite)
    stats = compare.tap_stats(aligned, dtype)
    if unfinite:
        tap, request = unfinite[0]
        raise BadInput(
            f"cannot judge: the trusted reference ({high.engine} {high.dtype}) itself holds NaN or inf at {tap} "
            f"(request {request}), so no engine can be compared with it; the model is broken, not the engine "
            "(check the checkpoint's weights and config for NaN, inf or out-of-range values)"
        )
    sampled, draws = sampler_judgement(scenario, target, high)
    stats += sampled
    first = compare.first_divergence(stats)
    texts = text_divergence(scenario, target, high)
    taps = compare.divergent_taps(stats) + ([TEXT_TAP] if texts else [])
    if first is None and texts:
        first = text_divergence_record(target, texts)
    return ProbeResult(
        dtype=scenario.target.dtype,
        first=first,
        tokens=greedy_token_divergence(scenario, target, high, dtype),
        layers=compare.layer_table(stats),
        divergent_taps=taps,
        engine_runs=0,
        target=target,
        stats=stats,
        texts=texts,
        draws=draws,
    )


def trusted_finite(aligned, unfinite: list[tuple[str, int]]):
    """`aligned` passed through, noting each (tap, request) where the trusted high-precision reference is
    not finite (taps that may mask entries with -inf left out): there every ratio is meaningless, and
    NaN rows, blanked in both runs, read as agreement."""
    from tools.probe import compare

    for a in aligned:
        if a.tap not in compare.MASK_TOLERANT and not compare.all_finite(a.y):
            unfinite.append((a.tap, a.request))
        yield a


def without_sampling_judged(trace: Trace) -> Trace:
    """The trace less its taps judged as sampling (compare.SAMPLING_JUDGED, by tools.probe.sampler_taps on
    the target and high-precision traces): aligned against it, they are skipped before any of their
    rows is read (vocabulary-wide rows, hundreds of MB for a real model). Blocks are shared, not copied."""
    from tools.probe import compare
    from tools.probe.trace import Trace

    blocks = [b for b in trace.blocks() if b.name not in compare.SAMPLING_JUDGED]
    return Trace(trace.engine, trace.dtype, trace.outputs, meta=trace.meta, blocks=blocks)


def text_divergence(scenario: Scenario, target: Trace, reference: Trace) -> list[int]:
    """Requests whose reported text differs from the reference's decoding of the same tokens
    (teacher forcing: same ids, so any difference is the target's detokenization). Requests with
    stop strings are skipped (their text is cut), and so are outputs without text."""
    out = []
    for r, req in enumerate(scenario.requests):
        t, ref = target.outputs[r].text, reference.outputs[r].text
        if req.sampling.get("stop") or t is None or ref is None:
            continue
        if t != ref:
            out.append(r)
    return out


def text_divergence_record(target: Trace, requests: list[int]) -> compare.Divergence:
    """The text mismatch as a divergence at the `detokenizer` pseudo-tap, over the generated positions."""
    from tools.probe import compare

    o = target.outputs[requests[0]]
    positions = list(range(len(o.prompt_ids), len(o.prompt_ids) + len(o.output_ids)))
    return compare.Divergence(
        tap=TEXT_TAP,
        step=0,
        requests=requests,
        positions=positions,
        steps=[],
        ratio=TEXT_MISMATCH_RATIO,
        evidence=[f"request {r}: text differs from decoding its own tokens" for r in requests],
    )


def greedy_token_divergence(scenario: Scenario, target: Trace, high: Trace, dtype: str = "") -> dict[int, int]:
    from tools.probe import compare
    from tools.probe.align import index

    logits = index(high, names=("sampler.logits", "logits"))
    out = {}
    for r, req in enumerate(scenario.requests):
        # greedy picks the argmax after penalties: use the reference's sampler logits when it has them
        tap = "sampler.logits" if ("sampler.logits", r) in logits else "logits"
        if not req.greedy or (tap, r) not in logits:
            continue
        rows = logits[(tap, r)]
        seq = target.sequences()[r]
        pos = compare.token_divergence(
            seq,
            len(target.outputs[r].prompt_ids),
            rows.tensor,
            rows.positions,
            compare.TOKEN_MARGIN[dtype or scenario.target.dtype],
        )
        if pos is not None:
            out[r] = pos
    return out


def probe(
    scenario: Scenario, target_source: Path | None = None, reference_source: Path | None = None, **kwargs
) -> ProbeResult:
    return Prober().probe(scenario, target_source, reference_source, **kwargs)


# ---- CLI -------------------------------------------------------------------------------------


def parse_spec(text: str, base: EngineSpec) -> EngineSpec:
    """'transformers:bfloat16:attn_implementation=sdpa,x=1' -> EngineSpec (missing parts from base)."""
    parts = text.split(":")
    if len(parts) > 3 or not text.strip():
        raise BadInput(f"engine spec {text!r} is not ENGINE[:DTYPE[:key=value,...]]")
    options = dict(base.options)
    for kv in parts[2].split(",") if len(parts) > 2 and parts[2] else []:
        k, eq, v = kv.partition("=")
        if not eq or not k.strip():
            raise BadInput(f"engine option {kv!r} in {text!r} is not key=value")
        options[k.strip()] = _literal(v)
    return EngineSpec(parts[0] or base.engine, parts[1] if len(parts) > 1 and parts[1] else base.dtype, options)


def _literal(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v.lower(), v)


def render_table(result: ProbeResult) -> str:
    from tools.probe import compare
    from tools.probe.taps import DRAWS_TAP

    diverging = {compare.layer_key(s.tap) for s in result.stats if s.diverges}

    def mark(name: str, ratio: float) -> str:
        if ratio <= compare.THRESHOLD:
            return ""
        # rows over the threshold that are a few noise outliers (compare.mark_outliers) are not a divergence
        return "  <-- diverges" if name in diverging else "  (a few outlier rows: noise, not a divergence)"

    lines = [f"{'where':<16}{'max ratio':>12}", "-" * 28]
    lines += [f"{name:<16}{ratio:>12.3g}" + mark(name, ratio) for name, ratio in result.layers]
    lines.append("")
    lines.append(result.summary)
    if result.first:
        lines.append(f"  steps {compare.compress(result.first.steps)}")
    for r, pos in result.tokens.items():
        lines.append(f"  request {r}: greedy tokens wrong from position {pos}")
    if result.draws is not None and result.diverged and result.first and result.first.tap != DRAWS_TAP:
        lines.append(f"  {result.draws.line()}")  # the summary above says it when the draws diverge first
    lines.append(f"engine runs: {result.engine_runs}")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m tools.probe.prober", description=__doc__.split("\n")[0], epilog=EPILOG)
    ap.add_argument("--scenario", required=True, type=Path)
    ap.add_argument("--target", help="ENGINE[:DTYPE[:k=v,...]] overriding [target]")
    ap.add_argument("--engine", help="target engine: a registered name or module:Class (docs/engines.md)")
    ap.add_argument(
        "--reference",
        help="ENGINE[:DTYPE[:k=v,...]] overriding [reference]; DTYPE is the trusted "
        "run's precision (float64 or float32), the reference also runs in the "
        "target's dtype",
    )
    ap.add_argument(
        "--target-source",
        type=Path,
        help="source tree under test: the folder holding the engine's package (first on PYTHONPATH)",
    )
    ap.add_argument("--taps", nargs="*", help="tap patterns to capture (default: all); each must match a tap")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="no live status line on stderr")
    ap.add_argument("--keep-temp", action="store_true", help="keep each engine run's folder (/tmp/diffdx-run-*)")
    return ap.parse_args(argv)


def scenario_from_args(args) -> tuple[Scenario, Path | None]:
    """The scenario with the command line's overrides, checked before any engine starts."""
    from tools.preflight import preflight

    sc = load(args.scenario)
    if args.target:
        sc = sc.with_target(**vars_of(parse_spec(args.target, sc.target)))
    if args.reference:
        spec = parse_spec(args.reference, sc.reference)
        dtype = sc.reference.dtype
        if len(args.reference.split(":")) > 1 and args.reference.split(":")[1]:
            check_reference_dtype(spec.dtype)
            dtype = spec.dtype
        sc = sc.with_reference(engine=spec.engine, dtype=dtype, options=spec.options)
    if args.engine:
        sc = sc.with_target(engine=args.engine)
    return sc, preflight(sc, args.target_source, args.taps)


def main(argv=None) -> int:
    args = parse_args(argv)
    end_cleanly(args.keep_temp)
    sc, source = scenario_from_args(args)
    try:
        with progress.live(quiet=args.quiet):
            result = Prober(device=args.device).probe(sc, source, taps=args.taps)
    except EngineRunError as e:
        if e.log:
            print(e.log[-2000:], file=sys.stderr)
        raise
    print(json.dumps(result.to_dict(), indent=2) if args.json else render_table(result))
    return 1 if result.diverged else 0


def vars_of(spec: EngineSpec) -> dict:
    return {"engine": spec.engine, "dtype": spec.dtype, "options": spec.options}


if __name__ == "__main__":
    sys.exit(run_cli(main))
