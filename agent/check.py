"""diffdx check: sweep an engine against the reference over a matrix of configurations, for CI.

    python -m agent.check --engine tinyserve [--target-source DIR] [--matrix FILE] [--budget-min 20]

Every cell (arch x dtype x feature set x workload x checkpoint config variant) is one probe.
Divergent cells are grouped by first divergent tap and trigger, each group's smallest member is minimized further, and when the
target source is a git repository the group is diagnosed with the full pipeline. Writes
junit.xml (one test per cell), summary.md, results.json and per group its minimal scenario,
divergence plot and report. Exit 0: every cell agrees; 1: a cell diverged or its engine failed;
2: bad input; 3: environment (docs/check.md, docs/exit-codes.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import tomli_w

from tools.engines.runner import EngineRunError
from tools.errors import AGREE, DIVERGED, EPILOG, BadInput, run_cli, writable_dir
from tools.preflight import check_engine, check_options, check_target_source
from tools.probe import compare
from tools.probe.prober import Prober, ProbeResult, draws_dict, parse_spec, render_table
from tools.scenario import EngineSpec, Scenario, load, unhonoured_sampling
from tools.sweep.group import CellResult, Group, any_layer, group_cells, minimize
from tools.sweep.matrix import (
    WORKLOADS,
    Cell,
    ConfigVariant,
    Feature,
    Scope,
    covering_order,
    load_matrix,
    nearest_first,
    scenario_of,
)
from tools.sweep.output import junit_xml, markdown_summary

MINIMIZE_PROBES = 8  # probes spent shrinking one group's scenario
# with --fail-fast: does this failing cell (its result, its scenario) end the sweep?
StopRule = Callable[[CellResult, Scenario], bool]


def declared_axes(spec: EngineSpec, source: Path | None):
    """What the engine's adapter declares for the tree under test -> (its features: trigger axis
    name -> the options that switch it on; its checkpoint config variants; its option canonicalizer;
    the request sampling keys it honours, None: all; the archs, dtypes and windows it runs)."""
    from tools.engines import engine_capabilities

    caps = engine_capabilities(spec.engine, source)
    features = {axis.name: Feature(dict(axis.options), axis.alone, tuple(axis.archs)) for axis in caps.trigger_axes}
    variants = {
        axis.name: ConfigVariant(dict(axis.model), tuple(axis.archs), dict(axis.options), *_crossed(axis))
        for axis in caps.config_axes
    }
    scope = Scope(spec.engine, caps)
    return features, variants, caps.canonical_options, caps.sampling_keys, scope


def _crossed(axis) -> tuple:
    """A config axis's `crossed` axes as ConfigVariant takes them (none: its default)."""
    return (tuple(axis.crossed),) if axis.crossed else ()


def ordered_cells(args, matrix, declared, variants, canonical, scope: Scope | None = None) -> list[Cell]:
    """The matrix's cells the engine runs, in covering order, or, with --prefer, nearest the reported
    scenario first."""
    cells = covering_order(matrix.cells(variants, declared, scope))
    if not args.prefer:
        return cells
    report = load(args.prefer)
    report = replace(report, target=replace(report.target, options=canonical(report.target.options)))
    return nearest_first(cells, report, declared, variants)


def first_tap(result: ProbeResult) -> str:
    """Where a divergent probe first parts: its first tap, else the tokens, else the text."""
    if result.first:
        return result.first.tap
    return "text" if result.texts and not result.tokens else "tokens"


def verdict(cell: Cell, result: ProbeResult, seconds: float) -> CellResult:
    draws = draws_dict(result.draws)
    if not result.diverged:
        return CellResult(cell, "agree", seconds, result.summary, engine_runs=result.engine_runs, draws=draws)
    first = result.first
    tap = first_tap(result)
    return CellResult(
        cell,
        "diverge",
        seconds,
        result.summary,
        first_tap=tap,
        ratio=first.ratio if first else None,
        engine_runs=result.engine_runs,
        detail=render_table(result),
        draws=draws,
    )


def run_cell(
    prober: Prober, cell: Cell, scenario: Scenario, source: Path | None
) -> tuple[CellResult, ProbeResult | None]:
    start = time.monotonic()
    try:
        result = prober.probe(scenario, source)
    except EngineRunError as e:
        return CellResult(cell, "error", time.monotonic() - start, str(e).splitlines()[0][:300], detail=str(e)), None
    return verdict(cell, result, time.monotonic() - start), result


def sweep(
    cells: list[tuple[Cell, Scenario]],
    prober: Prober,
    source: Path | None,
    budget_s: float | None,
    log,
    fail_fast: bool = False,
    stops: StopRule | None = None,
) -> tuple[list[CellResult], dict[str, ProbeResult]]:
    """Probe the cells in order until the time budget would be overrun by the next one (judged by
    the median cell so far), or, with `fail_fast`, until one fails (diverges or errors; `stops`, when
    given, decides instead which failing cell ends the sweep); the rest are reported skipped."""
    stops = stops or (lambda r, _sc: r.status in ("diverge", "error"))
    stopped = False
    start = time.monotonic()
    results: list[CellResult] = []
    probes: dict[str, ProbeResult] = {}
    for i, (cell, scenario) in enumerate(cells):
        elapsed = time.monotonic() - start
        typical = statistics.median(r.seconds for r in results) if results else 0.0
        note = None
        if budget_s is not None and elapsed + typical > budget_s:
            note = f"not run: the {budget_s / 60:g}-minute budget was spent after {len(results)} cells"
        elif fail_fast and stopped:
            note = "not run: --fail-fast stopped at the first failing cell"
        if note:
            results += [CellResult(c, "skipped", 0.0, note) for c, _ in cells[i:]]
            break
        r, probe = run_cell(prober, cell, scenario, source)
        results.append(r)
        if probe is not None and r.status == "diverge":
            probes[cell.id] = probe
        stopped = fail_fast and r.status in ("diverge", "error") and stops(r, scenario)
        log(
            f"[{i + 1}/{len(cells)}] {cell.id}: {r.status} ({r.seconds:.1f} s) {r.summary if r.status != 'agree' else ''}"
        )
    return results, probes


def still_diverges(prober: Prober, source: Path | None, tap_group: str):
    """A reduction is kept when the probe still diverges with the first divergence in the same
    place (any layer): a smaller scenario that diverges elsewhere would be another bug."""

    def check(sc: Scenario) -> bool:
        try:
            r = prober.probe(sc, source)
        except EngineRunError:
            return False
        return r.diverged and any_layer(first_tap(r)) == tap_group

    return check


def explain(group: Group, sc: Scenario) -> str:
    """The issue text a diagnosis of the group starts from: what the sweep saw, no guesses."""
    rep = group.representative()
    return (
        f"diffdx check: {sc.target.engine} diverges from the reference in {len(group.cells)} cells of the sweep "
        f"(feature set `{group.key[1]}`, workloads {', '.join(group.workloads)}), first at `{group.key[0]}`.\n\n"
        f"Representative cell {rep.cell.id}: {rep.summary}\n\nCells: " + ", ".join(r.cell.id for r in group.cells)
    )


def follow_up(group: Group, sc: Scenario, prober: Prober, source: Path | None, out: Path, args, log) -> dict:
    """Minimize the group's scenario, plot it, and diagnose it when the source has a history."""
    from tools.report import plot_divergence

    folder = out / group.id
    folder.mkdir(parents=True, exist_ok=True)
    keep = frozenset(args.spec.options)  # the user's own options (--engine) stay
    small, steps, used = minimize(sc, still_diverges(prober, source, group.key[0]), args.minimize_probes, keep)
    rel = folder.relative_to(out)  # paths in summary.md and results.json are relative to --out
    info: dict = {"steps": steps, "probes": used, "scenario": str(rel / "scenario.toml")}
    (folder / "scenario.toml").write_text(tomli_w.dumps(small.to_dict()))
    result = prober.probe(small, source)
    if result.diverged and plot_divergence(
        result.stats,
        folder / "divergence.png",
        result.first.requests if result.first else None,
        result.first.tap if result.first else None,
        title=f"{group.id}: {result.summary}",
    ):
        info["plot"] = str(rel / "divergence.png")
    info["minimal_summary"] = result.summary
    if args.no_diagnose:
        info["diagnosis_note"] = "not diagnosed (--no-diagnose)"
    elif source is None or not (source / ".git").exists():
        info["diagnosis_note"] = "not diagnosed: --target-source is not a git repository (no history to read)"
    else:
        log(f"diagnosing {group.id} ...")
        info.update(diagnose_group(group, small, source, folder, args))
        if "report" in info:
            info["report"] = str(Path(info["report"]).relative_to(out))
    return info


def diagnose_group(group: Group, sc: Scenario, source: Path, folder: Path, args) -> dict:
    from agent.run import Inputs, RunConfig, diagnose

    if args.good_ref:
        sc = replace(sc, good_ref=args.good_ref)
    inputs = Inputs(f"check-{group.id}", explain(group, sc), sc, source, source)
    report = diagnose(inputs, RunConfig(llm=args.llm), out_dir=folder / "report")
    hyps = report.get("hypotheses") or []
    out: dict = {"report": str(folder / "report" / "report.json")}
    if hyps:
        out["top"] = {k: hyps[0].get(k) for k in ("file", "function", "commit", "verified")}
    else:
        out["diagnosis_note"] = "the pipeline produced no hypothesis; see the report"
    return out


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m agent.check", description=__doc__.split("\n\n")[0], epilog=EPILOG)
    ap.add_argument("--engine", required=True, help="ENGINE[:key=value,...]: the target and options for every cell")
    ap.add_argument("--target-source", type=Path, help="source tree of the engine under test (a git repo: diagnosed)")
    ap.add_argument("--matrix", type=Path, help="TOML: arch, dtype, features, workload lists (default: all)")
    ap.add_argument("--reference", default=None, help="reference engine (default: transformers), e.g. refmodel")
    ap.add_argument("--budget-min", type=float, help="time budget; cells past it are skipped and listed")
    ap.add_argument("--prefer", type=Path, help="scenario TOML (a report's repro): the cells nearest it run first")
    ap.add_argument("--good-ref", help="a ref of --target-source known to be good (bisection for diagnoses)")
    ap.add_argument("--no-diagnose", action="store_true", help="group and minimize only, no diagnosis")
    ap.add_argument("--fail-fast", action="store_true", help="stop starting cells after the first failing one")
    ap.add_argument("--minimize-probes", type=int, default=MINIMIZE_PROBES, help="probes per group to shrink it")
    ap.add_argument("--llm", choices=("none", "openai"), default="none")
    ap.add_argument("--out", type=Path, default=Path("out/check"), help="output folder (default out/check)")
    ap.add_argument("--quiet", action="store_true", help="no per-cell lines on stderr")
    args = ap.parse_args(argv)
    if args.budget_min is not None and not args.budget_min > 0:
        raise BadInput(f"--budget-min must be > 0, got {args.budget_min}")
    if args.minimize_probes < 0:
        raise BadInput(f"--minimize-probes must be >= 0, got {args.minimize_probes}")
    if ":" in args.engine and "=" not in args.engine.split(":", 1)[1]:
        raise BadInput(f"--engine {args.engine!r}: give ENGINE[:key=value,...]; the dtype is an axis of the matrix")
    engine, _, opts = args.engine.partition(":")
    args.spec = parse_spec(f"{engine}::{opts}", EngineSpec(engine=engine))
    return args


def main(argv: list[str] | None = None) -> int:
    from tools.engines.runner import end_cleanly

    args = parse_args(argv)
    end_cleanly(False)
    check_engine(args.spec.engine, source=args.target_source)
    source = check_target_source(args.spec.engine, args.target_source)
    check_options(args.spec, source, "target")
    if args.reference:
        check_engine(args.reference)
    out = writable_dir(args.out)
    log = (lambda _msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    results, groups, wall, left_out = check(args, source, out, Prober(), log)
    print(
        f"{len(results)} cells: {sum(r.status == 'agree' for r in results)} agree, "
        f"{sum(r.status == 'diverge' for r in results)} diverge in {len(groups)} groups, "
        f"{sum(r.status == 'error' for r in results)} errored, {sum(r.status == 'skipped' for r in results)} skipped "
        f"({wall:.0f} s)"
        + (f"; {len(left_out)} parts of the matrix left out, not what {args.spec.engine} runs" if left_out else "")
        + f"; {out / 'summary.md'}"
    )
    return DIVERGED if any(r.status in ("diverge", "error") for r in results) else AGREE


def check(
    args, source: Path | None, out: Path, prober: Prober, log, stops: StopRule | None = None
) -> tuple[list[CellResult], list[Group], float, list[str]]:
    """Sweep the matrix, group and follow up the divergent cells, write the outputs to `out`; -> the cells'
    results, the groups, the wall seconds, and why parts of the matrix were left out.
    `prober` may be shared by several checks (benchmark.check_cases): its reference runs are reused;
    `stops`: with --fail-fast, which failing cell ends the sweep (default: any)."""
    declared, variants, canonical, sampling_keys, scope = declared_axes(args.spec, source)
    matrix = load_matrix(args.matrix, declared, variants)
    left_out = matrix.left_out(scope, variants)
    for reason in left_out:
        log(f"left out of the matrix: {reason}")
    reference = {"engine": args.reference} if args.reference else None
    cells = [
        (c, scenario_of(c, args.spec, declared, reference, variants, sampling_keys))
        for c in ordered_cells(args, matrix, declared, variants, canonical, scope)
    ]
    if not cells:
        raise BadInput(f"no cell of the matrix is one {args.spec.engine} runs: " + "; ".join(left_out))
    unhonoured = sorted(
        {
            k
            for w in WORKLOADS.values()
            for r in w(None)
            for k in unhonoured_sampling(r.get("sampling", {}), sampling_keys)
        }
    )
    if unhonoured:
        log(f"sampling {unhonoured} left out of the workloads: {args.spec.engine} does not honour them")
    start = time.monotonic()
    budget_s = args.budget_min * 60 if args.budget_min else None
    results, _ = sweep(cells, prober, source, budget_s, log, fail_fast=args.fail_fast, stops=stops)
    groups = group_cells(results)
    scenarios = dict((c.id, sc) for c, sc in cells)
    followed = {
        g.id: follow_up(g, scenarios[g.representative().cell.id], prober, source, out, args, log) for g in groups
    }
    wall = time.monotonic() - start
    (out / "junit.xml").write_text(junit_xml(results, "diffdx check", args.spec.engine))
    (out / "summary.md").write_text(markdown_summary(results, groups, followed, args.spec.engine, wall, left_out))
    (out / "results.json").write_text(
        json.dumps(results_json(results, groups, followed, wall, left_out), indent=2) + "\n"
    )
    return results, groups, wall, left_out


def results_json(
    results: list[CellResult], groups: list[Group], followed: dict, wall: float, left_out: list[str] | None = None
) -> dict:
    return {
        "wall_s": round(wall, 1),
        "threshold": compare.THRESHOLD,
        "left_out": left_out or [],  # parts of the matrix the engine does not run, and why
        "cells": [
            {"cell": r.cell.id, **{k: v for k, v in asdict(r).items() if k not in ("cell", "detail")}} for r in results
        ],
        "groups": [
            {
                "id": g.id,
                "tap": g.key[0],
                "features": g.key[1],
                "workloads": g.workloads,
                "cells": [r.cell.id for r in g.cells],
                **followed.get(g.id, {}),
            }
            for g in groups
        ],
    }


if __name__ == "__main__":
    sys.exit(run_cli(main))
