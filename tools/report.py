"""The diagnosis report (docs/design.md §5): report.json, report.md and divergence.png.

`build_report` turns the stage outputs into the §5 dict (exactly its keys, plus the allowed
extras: trigger, precision, trials, bisection, drill_down, llm_fallbacks, …); `write_report`
writes the three files. `check_report` lists every way a dict breaks the contract (pure).

Honesty: `reproduced` is true only when the *reported* issue reproduces (as given, or with a
trigger the issue describes). A divergence the trigger search found elsewhere is a side finding:
`diagnosis_of` says which of the two the rest of the report is about ("reported issue", "side
finding" or null) and `side_findings` lists every one. `ran` says what ran: engines, dtypes,
source tree and commit, runs that answered or failed; report.md claims agreement only over runs
that answered, and says so when nothing ran.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prompts import render_document
from tools.history.gitrepo import GitError, run_git
from tools.hypotheses.evidence import Culprit, DrillDown, Hypothesis, Reproduction

MAX_HYPOTHESES = 5
REPORT_KEYS = ("issue", "reproduced", "first_divergence", "kernel", "commit", "hypotheses", "cost")
HYPOTHESIS_KEYS = (
    "rank",
    "file",
    "function",
    "commit",
    "category",
    "confidence",
    "verified",
    "explanation",
    "evidence",
    "suggested_fix",
)
# Beyond §5: the scorer's component label, which evidence verified it and the edit that did.
HYPOTHESIS_EXTRAS = ("component", "verified_by", "verifying_diff")
COST_KEYS = ("engine_runs", "llm_calls", "tokens_in", "tokens_out", "wall_s")
DIVERGENCE_KEYS = ("tap", "step", "requests", "positions", "ratio")


def hypothesis_dict(h: Hypothesis, rank: int) -> dict:
    """§5 keys, plus `component` (the scorer's component-level match), and for a verified one
    `verified_by` (which evidence verified it) and `verifying_diff` (the fix or patch that did)."""
    d = {key: getattr(h, key) for key in HYPOTHESIS_KEYS if key != "rank"}
    d["confidence"] = round(float(d["confidence"]), 3)
    proof = {"verified_by": h.verified_by, "verifying_diff": h.verifying_diff}
    return {"rank": rank, **d, "evidence": [str(e) for e in h.evidence], "component": h.component, **proof}


def first_divergence(repro: Reproduction | None) -> dict | None:
    probe = repro.probe if repro is not None else None
    if probe is None or probe.first is None:
        return None
    return probe.first.to_dict()


def diagnosis_of(repro: Reproduction | None) -> str | None:
    """What the divergence the report describes is: the user's issue, a side finding, or nothing."""
    if repro is None or not repro.reproduced:
        return None
    return "reported issue" if repro.on_issue else "side finding"


def build_report(
    issue: str,
    repro: Reproduction | None,
    drill: DrillDown | None,
    culprit: Culprit | None,
    hypotheses: list[Hypothesis],
    cost: dict,
    extras: dict | None = None,
) -> dict:
    """Stage outputs -> the §5 report dict (extras appended after the contract's keys)."""
    report = {
        "issue": str(issue),
        "reproduced": diagnosis_of(repro) == "reported issue",
        "first_divergence": first_divergence(repro),
        "kernel": drill.kernel if drill else None,
        "commit": {"sha": culprit.sha, "subject": culprit.subject} if culprit else None,
        "hypotheses": [hypothesis_dict(h, i) for i, h in enumerate(hypotheses[:MAX_HYPOTHESES], 1)],
        "cost": {key: cost.get(key, 0) for key in COST_KEYS},
    }
    report["diagnosis_of"] = diagnosis_of(repro)
    if repro is not None:
        report.update(
            trigger=repro.trigger if repro.on_issue else None,
            precision=repro.precision,
            side_findings=[asdict(f) for f in repro.side_findings],
            trials=[
                {
                    "description": t.description,
                    "diverged": t.diverged,
                    "summary": t.summary,
                    "engine_runs": t.engine_runs,
                    "dtype": t.dtype,
                    "off_issue": t.off_issue,
                }
                for t in repro.trials
            ],
        )
        report["tokens"] = {str(k): v for k, v in (repro.probe.tokens if repro.probe else {}).items()}
    if drill is not None:
        report["drill_down"] = {
            "tap": drill.tap,
            "layer": drill.layer,
            "component": drill.component,
            "pattern": drill.pattern,
            "evidence": drill.evidence,
            "op": drill.op,
        }
    if culprit is not None:
        report["bisection"] = {
            "sha": culprit.sha,
            "subject": culprit.subject,
            "message": culprit.message,
            "tested": [list(t) for t in culprit.tested],
            "ambiguous": culprit.ambiguous,
        }
    report.update({k: v for k, v in (extras or {}).items() if k not in report})
    return json.loads(json.dumps(report, default=str))  # plain JSON types only


def what_ran(runs: list[dict], engine_runs: int, target_source: Path | None) -> dict:
    """Prober.runs (one dict per engine run that answered) -> per role: engines, dtypes, runs, the
    package files imported; plus the target's source tree and its commit. Pure but for `source_tree`."""
    out: dict[str, Any] = {"engine_runs": engine_runs, "answered": len(runs), "failed": max(0, engine_runs - len(runs))}
    for role in ("target", "reference"):
        mine = [r for r in runs if r["role"] == role]
        out[role] = {
            "engines": sorted({r["engine"] for r in mine}),
            "dtypes": sorted({r["dtype"] for r in mine}),
            "runs": len(mine),
            "imported": sorted({r["imported"] for r in mine if r.get("imported")}),
        }
    tree = str(target_source) if target_source else None
    out["target"]["runs_in_other_trees"] = sum(1 for r in runs if r["role"] == "target" and r["source"] != tree)
    # an engine imported from outside the tree it was pointed at is not the engine under test
    out["target"]["outside_source"] = sorted(
        {
            r["imported"]
            for r in runs
            if r["role"] == "target" and r["source"] and r.get("imported") and not _inside(r["imported"], r["source"])
        }
    )
    out["target_source"] = source_tree(target_source)
    return out


def _inside(file: str, root: str) -> bool:
    return Path(file).resolve().is_relative_to(Path(root).resolve())


def source_tree(path: Path | None) -> dict:
    """{path, commit, dirty} of the tree the target was imported from (None: the installed package)."""
    if path is None:
        return {"path": None, "commit": None, "dirty": None}

    def git(*args: str) -> str | None:
        try:
            return run_git(path, *args, timeout=30).strip()
        except GitError:
            return None

    commit = git("rev-parse", "HEAD")
    return {"path": str(path), "commit": commit, "dirty": bool(git("status", "--porcelain")) if commit else None}


def check_report(report: dict) -> list[str]:
    """Every way `report` breaks the §5 contract; [] when it keeps it. Pure."""
    problems = [f"missing key {k!r}" for k in REPORT_KEYS if k not in report]
    if problems:
        return problems
    if not isinstance(report["issue"], str) or not isinstance(report["reproduced"], bool):
        problems.append("issue must be a string and reproduced a bool")
    fd = report["first_divergence"]
    if fd is not None and (not isinstance(fd, dict) or set(DIVERGENCE_KEYS) - set(fd)):
        problems.append(f"first_divergence needs keys {DIVERGENCE_KEYS}")
    if report["commit"] is not None and set(report["commit"]) != {"sha", "subject"}:
        problems.append("commit must be {sha, subject} or null")
    hyps = report["hypotheses"]
    if not isinstance(hyps, list) or len(hyps) > MAX_HYPOTHESES:
        return problems + [f"hypotheses must be a list of at most {MAX_HYPOTHESES}"]
    for i, h in enumerate(hyps, 1):
        missing = [k for k in HYPOTHESIS_KEYS if k not in h]
        if missing or h["rank"] != i or not isinstance(h["evidence"], list) or not 0 <= h["confidence"] <= 1:
            problems.append(f"hypothesis {i}: missing {missing}, or rank/evidence/confidence out of shape")
    if set(COST_KEYS) - set(report["cost"]):
        problems.append(f"cost needs keys {COST_KEYS}")
    return problems


def render_markdown(report: dict) -> str:
    view = {
        "trigger": None,
        "precision": None,
        "trials": [],
        "bisection": None,
        "drill_down": None,
        "llm_fallbacks": [],
        "error": None,
        "stopped": None,
        "diagnosis_of": None,
        "side_findings": [],
        "ran": None,
        **report,
    }
    view["ran_trials"] = [t for t in view["trials"] if not t["summary"].startswith("engine run failed")]
    return render_document("report.md.j2", r=view)


def divergence_series(stats, requests: list[int] | None = None) -> dict[int, list[tuple[str, float]]]:
    """TapStats -> {request: [(tap, max ratio), …] in execution order} for the diverging
    requests (all requests with a row over the threshold when `requests` is None). Pure."""
    from tools.probe import taps as tapnames

    if requests is None:
        requests = sorted({s.request for s in stats if s.diverges})
    out: dict[int, list[tuple[str, float]]] = {}
    for s in sorted(stats, key=lambda s: (s.first_step, tapnames.order_key(s.tap))):
        if s.request in requests and s.rows:
            out.setdefault(s.request, []).append((s.tap, s.max_ratio))
    return out


def plot_title(report: dict, probe) -> str:
    """'Issue 1201: tinyserve bfloat16 vs transformers' + the trigger and first divergence. Pure."""
    target = getattr(getattr(probe, "target", None), "engine", None) or "target"
    head = f"Issue {report.get('issue', '?')}: {target} {probe.dtype} vs the reference"
    trigger = report.get("trigger") or "the scenario as given"
    first = probe.first
    where = f"first divergence at {first.tap} (ratio {first.ratio:.3g})" if first is not None else "no tap diverges"
    return f"{head}\ntrigger: {trigger}; {where}"


def layer_bands(taps: list[str]) -> list[tuple[int, int, int]]:
    """Taps in execution order -> [(layer, first index, last index)] for each run of one layer. Pure."""
    from tools.probe import taps as tapnames

    bands: list[tuple[int, int, int]] = []
    for i, tap in enumerate(taps):
        layer = tapnames.split(tap)[0]
        if layer is None:
            continue
        if bands and bands[-1][0] == layer and bands[-1][2] == i - 1:
            bands[-1] = (layer, bands[-1][1], i)
        else:
            bands.append((layer, i, i))
    return bands


MAX_TAP_LABELS = 90  # beyond this many taps, label layers instead of taps
MAX_LAYER_LABELS = 24


def tap_ticks(taps: list[str]) -> tuple[list[int], list[str]]:
    """x ticks: every tap by its name within the layer, or (many taps) every k-th layer's start. Pure."""
    from tools.probe import taps as tapnames

    if len(taps) <= MAX_TAP_LABELS:
        return list(range(len(taps))), [tapnames.split(t)[1] for t in taps]
    bands = layer_bands(taps)
    every = -(-len(bands) // MAX_LAYER_LABELS)
    return [lo for _, lo, _ in bands[::every]], [f"layer {layer}" for layer, _, _ in bands[::every]]


def warm_plotting() -> threading.Thread:
    """Import matplotlib's plotting (Agg) in a background thread, so that it is there when
    write_report plots: seconds of imports, which a diagnosis's orchestrator can spend while it waits
    on its engine processes. Best effort: plot_divergence imports whatever is still missing itself."""

    def load():
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
        except Exception:  # the plot's own import will say what is wrong
            pass

    thread = threading.Thread(target=load, name="diffdx-warm-plotting", daemon=True)
    thread.start()
    return thread


def plot_divergence(
    stats, path: Path, requests: list[int] | None = None, first_tap: str | None = None, title: str | None = None
) -> bool:
    """Error ratio along execution order for the diverging requests, with the threshold line, the
    layers shaded and the first divergence marked. False (nothing written) when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tools.probe import compare

    series = divergence_series(stats, requests)
    if not series:
        return False
    taps = [t for t, _ in next(iter(series.values()))]
    fig, ax = plt.subplots(figsize=(min(16, max(10, 0.16 * len(taps))), 5.2))
    for k, (layer, lo, hi) in enumerate(layer_bands(taps)):
        ax.axvspan(lo - 0.5, hi + 0.5, color="0.93" if k % 2 == 0 else "white", zorder=0)
        if len(taps) <= MAX_TAP_LABELS:  # small model: the layer above its band, tap names below
            ax.text(
                (lo + hi) / 2,
                1.01,
                f"layer {layer}",
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=8,
                color="0.35",
            )
    for request, points in series.items():
        ax.plot(
            [taps.index(t) for t, _ in points if t in taps],
            [max(r, 1e-3) for t, r in points if t in taps],
            marker=".",
            linewidth=1.2,
            label=f"request {request}",
            zorder=3,
        )
    ax.axhline(compare.THRESHOLD, color="red", linestyle="--", linewidth=1, label=f"threshold {compare.THRESHOLD:g}")
    if first_tap in taps:
        ax.axvline(
            taps.index(first_tap), color="black", linestyle=":", linewidth=1.2, label=f"first divergence: {first_tap}"
        )
    ax.set_xticks(*tap_ticks(taps), rotation=90, fontsize=7)
    ax.set_xlim(-0.5, len(taps) - 0.5)
    ax.set_yscale("log")
    ax.grid(axis="y", which="major", color="0.85", linewidth=0.6)
    ax.set_xlabel("tap, in execution order", fontsize=9)
    ax.set_ylabel("error ratio: target error / reference noise (log)", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", framealpha=0.9)
    if title:
        ax.set_title(title, fontsize=10, loc="left", pad=16)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(report: dict, out_dir: str | Path, probe=None) -> dict[str, Path]:
    """DIR/report.json, DIR/report.md and (with a diverging probe) DIR/divergence.png."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md"}
    paths["json"].write_text(json.dumps(report, indent=2) + "\n")
    paths["md"].write_text(render_markdown(report))
    if probe is not None and getattr(probe, "stats", None):
        first = probe.first.tap if probe.first is not None else None
        requests = probe.first.requests if probe.first is not None else None
        if plot_divergence(probe.stats, out_dir / "divergence.png", requests, first, plot_title(report, probe)):
            paths["png"] = out_dir / "divergence.png"
    return paths
