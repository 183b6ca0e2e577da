"""Run a diagnosing agent on benchmark cases and score it (docs/design.md §5, §6).

    python -m benchmark.run [--cases-dir DIR] [CASE ...] [--agent full|output-only|bisect-only|module:function]
                            [--llm none|openai] [--model NAME] [--config run.toml] [--max-engine-runs N]
                            [--max-wall-s S] [--verify-top N] [--workers N] [--ray | --ray-address A] [--samples N]
                            [--costs-from results.json] --out DIR

Per case (and sample) a worker builds the case repo in a temp dir and calls the agent with only
the CaseInput and the diagnosis's config (agent.config.RunConfig: `--config` file, then the
flags); the agent never sees the case folder or its truth. Cases start costliest first
(benchmark/schedule.py: an earlier run's `--costs-from` figures, else a prior by subject, track and
compile), so that with N workers no long case is left to run alone at the end. Each report's
`cost.cpu_s` is the CPU its diagnosis used, child processes included (benchmark/cputime.py). Output:

    DIR/args.json                 the run's config, the diagnosis's included (docs/style.md §12)
    DIR/<case-id>/report.json     the agent's report (+ report.md if it writes one); with
                                  --samples N > 1 also DIR/<case-id>/samples/<i>/report.json
    DIR/results.json              per-case scores and aggregates (benchmark.score)
    DIR/results.md                the table; DIR/results_by_category.png the chart

`--list` prints the selected cases (id, issue number, subject, category, title) and runs nothing.
Exit status (tools/errors.py): 0 the run finished (scores in results.md), 2 bad input (unknown
case, malformed case folder, bad flag, --out a file), 3 environment failure (--out not writable).
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path

from agent import config as agent_config
from benchmark.build import build_case_repo, read_commit_map
from benchmark.cases import Case, CaseError, case_input, load_case, load_cases, load_truth
from benchmark.cputime import tree_cpu_s
from benchmark.schedule import costliest_first, previous_costs
from benchmark.score import CaseScore, score_case, summarize
from tools import progress as status
from tools.errors import EPILOG, BadInput, run_cli, writable_dir

AGENTS = {
    "full": "agent.run:diagnose_case",
    "output-only": "benchmark.baselines:output_only",
    "bisect-only": "benchmark.baselines:bisect_only",
    "revert-recent": "benchmark.baselines:revert_recent",
    "revert-recent-all": "benchmark.baselines:revert_recent_all",
}
LLMS = agent_config.LLMS
PASSTHROUGH_ENV = ("DIFFDX_SUBJECTS", "DIFFDX_CACHE", "OMP_NUM_THREADS")  # the endpoint travels in the config
Agent = Callable[..., dict]  # (case_input: CaseInput, out_dir: Path, config: agent.config.RunConfig) -> report dict
ABLATED_AGENT = "benchmark.ablations:diagnose_ablated"  # the full pipeline with parts off (--ablate)
RAY_OBJECT_STORE_BYTES = 100 * 2**20  # a local Ray's object store: reports only (Ray's floor is 75 MiB)


class AgentLookupError(LookupError):
    """An agent name that does not resolve; the message lists the registered ones."""


class RayMissingError(RuntimeError):
    """--ray was asked for but `ray` cannot be imported."""


@dataclass(frozen=True)
class RunConfig:
    out: Path
    cases: tuple[str, ...] = ()
    cases_dir: Path | None = None
    agent: str = "full"
    llm: str = "none"
    workers: int = 1
    ray: bool = False
    ray_address: str | None = None  # join this Ray cluster (implies ray); None: $RAY_ADDRESS, else a local one
    samples: int = 1
    diagnosis: agent_config.RunConfig | None = None  # each diagnosis's config; None: the defaults with `llm`
    ablate: tuple[str, ...] = ()  # parts of the full pipeline switched off (benchmark/ablations.py)
    costs_from: Path | None = None  # an earlier results.json: its per-case CPU orders the cases (benchmark/schedule.py)

    def __post_init__(self):
        if self.llm not in LLMS:
            raise ValueError(f"--llm {self.llm!r} is not one of {', '.join(LLMS)}")
        if self.diagnosis is None:
            object.__setattr__(self, "diagnosis", agent_config.RunConfig(llm=self.llm))
        elif self.diagnosis.llm != self.llm:
            raise ValueError(f"the diagnosis config's llm {self.diagnosis.llm!r} is not --llm {self.llm!r}")
        if self.diagnosis is not None and self.diagnosis.ablate != self.ablate:  # one source: --ablate
            object.__setattr__(self, "diagnosis", replace(self.diagnosis, ablate=tuple(self.ablate)))
        if self.ray_address:
            object.__setattr__(self, "ray", True)
        if self.workers < 1 or self.samples < 1:
            raise ValueError(f"--workers and --samples must be >= 1, got {self.workers} and {self.samples}")
        if self.agent not in AGENTS and ":" not in self.agent:
            raise AgentLookupError(f"unknown agent {self.agent!r}; known: {', '.join(AGENTS)} (or module:function)")
        if self.ablate:
            from benchmark.ablations import parse_ablations

            parse_ablations(",".join(self.ablate))  # ValueError names the known ones
            if self.agent != "full":
                raise ValueError(f"--ablate switches off parts of the full pipeline, not of agent {self.agent!r}")


@dataclass(frozen=True)
class Job:
    """One diagnosis: picklable, so that it can travel to a process or a Ray worker."""

    case_dir: str
    sample: int
    agent: str
    config: agent_config.RunConfig
    out_dir: str
    env: dict[str, str] = field(default_factory=dict)


def resolve_agent(name: str) -> Agent:
    """'full' | 'output-only' | 'bisect-only' | 'module:function' -> the agent callable (imported lazily)."""
    target = AGENTS.get(name, name)
    if ":" not in target:
        raise AgentLookupError(f"unknown agent {name!r}; known: {', '.join(AGENTS)} (or module:function)")
    module, func = target.split(":", 1)
    try:
        agent = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise AgentLookupError(f"agent {name!r} ({target}) is not available: {e}") from None
    if not callable(agent):
        raise AgentLookupError(f"agent {name!r} ({target}) is not callable")
    return agent


def diagnose_one(job: Job) -> dict:
    """Build the case repo, run the agent on the CaseInput, write report.json. Never raises."""
    os.environ.update(job.env)
    case = load_case(job.case_dir)
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started, cpu_started = time.monotonic(), tree_cpu_s()
    commits = None
    with tempfile.TemporaryDirectory(prefix=f"diffdx-{case.id}-") as tmp:
        try:
            repo = build_case_repo(case, Path(tmp) / "repo")
            commits = read_commit_map(repo)
            report = _call_agent(job, case, repo, out_dir)
        except Exception as e:  # a crashing case is a scored miss, never the end of the run
            report = error_report(case.issue_number, f"{type(e).__name__}: {e}", traceback.format_exc())
        finally:  # a worker runs many cases: the zygotes of this case's trees would linger, idle, till the end
            from tools.engines.runner import stop_tree_zygotes

            stop_tree_zygotes(tmp)
    report.setdefault("issue", str(case.issue_number))
    cost = report.setdefault("cost", {})
    if isinstance(cost, dict):
        cost.setdefault("wall_s", round(time.monotonic() - started, 3))
        cost["cpu_s"] = round(tree_cpu_s() - cpu_started, 3)  # this process and its children (benchmark/cputime.py)
    write_json(out_dir / "report.json", report)
    return {"case": case.id, "sample": job.sample, "report": report, "commits": commits}


def _call_agent(job: Job, case: Case, repo: Path, out_dir: Path) -> dict:
    report = resolve_agent(job.agent)(case_input(case, repo), out_dir, job.config)
    if not isinstance(report, dict):
        raise TypeError(f"agent {job.agent!r} returned {type(report).__name__}, not a report dict")
    return report


def error_report(issue_number: int, error: str, trace: str = "") -> dict:
    return {
        "issue": str(issue_number),
        "reproduced": False,
        "error": error,
        "traceback": trace[-4000:],
        "hypotheses": [],
        "cost": {"engine_runs": 0, "llm_calls": 0, "tokens_in": 0, "tokens_out": 0},
    }


def make_jobs(cases: list[Case], cfg: RunConfig) -> list[Job]:
    env = agent_config.inherited(PASSTHROUGH_ENV)
    agent = ABLATED_AGENT if cfg.ablate else cfg.agent
    jobs = []
    for case in cases:
        for i in range(cfg.samples):
            out = cfg.out / case.id if cfg.samples == 1 else cfg.out / case.id / "samples" / str(i)
            jobs.append(Job(str(case.dir.resolve()), i, agent, cfg.diagnosis, str(out.resolve()), env))
    return jobs


def execute_local(jobs: list[Job], workers: int, on_done: Callable[[dict], None]) -> list[dict]:
    """Jobs on `workers` local processes (spawned: no torch/thread state inherited).

    A worker that dies (os._exit, the OOM killer, a segfault) breaks the whole pool, and every job
    not finished by then fails with it, though only one was at fault. Those jobs are run again in a
    fresh pool; a job caught in two broken pools runs alone, where a death is its own: that case's
    error report. The other cases are scored as if nothing had happened."""
    results: list[dict] = []
    broken_count = [0] * len(jobs)
    remaining = list(range(len(jobs)))
    while remaining:
        broken = _pool_round([jobs[i] for i in remaining], workers, results, on_done)
        for i in (remaining[k] for k in broken):
            broken_count[i] += 1
        again = [remaining[k] for k in broken]
        for i in [i for i in again if broken_count[i] >= 2]:
            _pool_round([jobs[i]], 1, results, on_done, last_try=True)
        remaining = [i for i in again if broken_count[i] < 2]
    return results


def _pool_round(
    jobs: list[Job], workers: int, results: list[dict], on_done: Callable[[dict], None], last_try: bool = False
) -> list[int]:
    """One pool over `jobs`; finished ones go to `results`. -> indices of the jobs a broken pool took
    down (none when `last_try`: then a broken pool is the job's own death, reported as its error)."""
    ctx = multiprocessing.get_context("spawn")
    broken = []
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(diagnose_one, job): k for k, job in enumerate(jobs)}
        for future in as_completed(futures):
            k = futures[future]
            if isinstance(future.exception(), BrokenProcessPool) and not last_try:
                broken.append(k)
                continue
            results.append(_result_or_crash(future.result, jobs[k]))
            on_done(results[-1])
    return sorted(broken)


def execute_ray(
    jobs: list[Job], workers: int, on_done: Callable[[dict], None], address: str | None = None
) -> list[dict]:
    """Jobs as Ray tasks (one CPU each) on the cluster at `address` (or $RAY_ADDRESS), else on a local
    Ray started here with `workers` CPUs and stopped at the end. A task whose worker process dies
    (killed, out of memory, os._exit) is not retried: it becomes that case's error report."""
    ray = import_ray()
    ray.init(**ray_init_args(workers, address, agent_config.inherited(("PYTHONPATH", "RAY_ADDRESS"))))
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(diagnose_one)
        pending = {task.remote(job): job for job in jobs}
        results = []
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            results.append(_result_or_crash(lambda r=ref: ray.get(r), pending.pop(ref)))
            on_done(results[-1])
        return results
    finally:
        ray.shutdown()  # leaves a joined cluster running; a local one started here stops


def ray_init_args(workers: int, address: str | None, env: dict[str, str]) -> dict:
    """ray.init's arguments. Ray workers do not share the driver's sys.path: diffdx's root, the cwd and
    the driver's PYTHONPATH travel in the runtime env. A local cluster is kept small: no dashboard, a
    100 MiB object store (reports are small), CPUs = workers. Pure."""
    paths = [str(Path(__file__).resolve().parents[1]), os.getcwd(), env.get("PYTHONPATH", "")]
    args: dict = {"runtime_env": {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, paths))}}}
    address = address or env.get("RAY_ADDRESS")
    if address:
        return {**args, "address": address}
    return {**args, "num_cpus": workers, "include_dashboard": False, "object_store_memory": RAY_OBJECT_STORE_BYTES}


def import_ray():
    try:
        import ray
    except ImportError:
        raise RayMissingError(
            "--ray needs Ray, which is not installed here: pip install ray==2.60.0, or pip install -e '.[ray]' "
            "(or drop --ray to run on local processes)"
        ) from None
    return ray


def _result_or_crash(get: Callable[[], dict], job: Job) -> dict:
    """A worker that died (not just a raising agent) still leaves an error report."""
    try:
        return get()
    except Exception as e:
        case = load_case(job.case_dir)
        report = error_report(case.issue_number, f"worker died: {type(e).__name__}: {e}")
        write_json(Path(job.out_dir) / "report.json", report)
        return {"case": case.id, "sample": job.sample, "report": report, "commits": None}


def run_benchmark(cfg: RunConfig) -> dict:
    """Diagnose and score every selected case; writes everything under cfg.out; returns results.json."""
    if cfg.ray:
        import_ray()  # before any work: a missing Ray is a usage error
    writable_dir(cfg.out)  # and so is an --out that is a file or read-only
    cases = load_cases(cfg.cases_dir, list(cfg.cases) or None)
    if not cases:
        raise CaseError(f"no cases to run in {cfg.cases_dir or 'the bundled cases dir'}")
    truths = {c.id: load_truth(c) for c in cases}  # a malformed truth.toml fails before any diagnosis
    resolve_agent(ABLATED_AGENT if cfg.ablate else cfg.agent)  # and so does an agent that cannot be imported
    previous = _previous_costs(cfg.costs_from)
    write_json(cfg.out / "args.json", run_record(cfg, cases))
    jobs = make_jobs(costliest_first(cases, previous), cfg)  # the longest first: no long case ends the run alone
    with status.task("benchmark cases done", total=len(jobs)) as line:
        if cfg.ray:
            results = execute_ray(jobs, cfg.workers, _progress(len(jobs), line), cfg.ray_address)
        else:
            results = execute_local(jobs, cfg.workers, _progress(len(jobs), line))
    scores = [_score(case, truths[case.id], results, cfg) for case in cases]
    out = results_record(cfg, scores)
    write_json(cfg.out / "results.json", out)
    (cfg.out / "results.md").write_text(results_markdown(out))
    plot_by_category(out, cfg.out / "results_by_category.png")
    return out


def _previous_costs(path: Path | None) -> dict[str, float]:
    if path is None:
        return {}
    try:
        return previous_costs(path)
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise ValueError(f"--costs-from {path}: not a readable results.json ({type(e).__name__}: {e})") from None


def _score(case: Case, truth, results: list[dict], cfg: RunConfig) -> CaseScore:
    mine = sorted((r for r in results if r["case"] == case.id), key=lambda r: r["sample"])
    if cfg.samples > 1:  # DIR/<case-id>/report.json is sample 0, as with one sample
        write_json(cfg.out / case.id / "report.json", mine[0]["report"])
    commits = next((r["commits"] for r in mine if r["commits"]), None)
    reports = [r["report"] for r in mine]
    return score_case(case.id, case.category, case.subject, reports, truth, commits, track=case.track)


def _progress(total: int, line=None) -> Callable[[dict], None]:
    done = [0]

    def report(result: dict) -> None:
        done[0] += 1
        if line is not None:
            line.advance(result["case"])
        rep = result["report"]
        status = (
            f"error: {rep['error'][:120]}" if rep.get("error") else f"{len(rep.get('hypotheses') or [])} hypotheses"
        )
        print(f"[{done[0]}/{total}] {result['case']} #{result['sample']}: {status}", file=sys.stderr, flush=True)

    return report


def config_record(cfg: RunConfig) -> dict:
    """The config as JSON data, the diagnosis's without secrets."""
    record = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    record = {k: (str(v) if isinstance(v, Path) else v) for k, v in record.items()}
    return {**record, "diagnosis": cfg.diagnosis.record() if cfg.diagnosis else None}


def run_record(cfg: RunConfig, cases: list[Case]) -> dict:
    record = config_record(cfg)
    record.update(
        case_ids=[c.id for c in cases],
        started=datetime.now(UTC).isoformat(timespec="seconds"),
        diffdx_commit=_diffdx_commit(),
        python=platform.python_version(),
        argv=sys.argv,
    )
    return record


def _diffdx_commit() -> str | None:
    from tools.history.gitrepo import GitError, run_git

    try:
        return run_git(Path(__file__).resolve().parents[1], "rev-parse", "HEAD").strip() or None
    except GitError:
        return None


def results_record(cfg: RunConfig, scores: list[CaseScore]) -> dict:
    summary = summarize(scores)
    return {
        "config": config_record(cfg),
        "overall": summary["overall"].to_dict(),
        "by_category": {k: a.to_dict() for k, a in summary["by_category"].items()},
        "by_subject": {k: a.to_dict() for k, a in summary["by_subject"].items()},
        "by_track": {k: a.to_dict() for k, a in summary["by_track"].items()},
        "cases": [s.to_dict() for s in scores],
        "cpu": cpu_summary([s.cpu_s for s in scores], cfg.workers),
    }


def cpu_summary(cpu_s: list[float], workers: int) -> dict:
    """Per-case CPU seconds -> total, per case, the longest, and the wall the run would take on `workers`
    quiet cores: max(total / workers, longest case) (a lower bound: ignores start-up and the order). Pure."""
    total = sum(cpu_s)
    longest = max(cpu_s, default=0.0)
    return {
        "total_s": round(total, 1),
        "per_case_s": round(total / len(cpu_s), 1) if cpu_s else 0.0,
        "longest_case_s": round(longest, 1),
        "workers": workers,
        "projected_quiet_wall_s": round(max(total / workers, longest), 1),
    }


def results_markdown(results: dict) -> str:
    """results.json -> the table: overall, per category, per subject, per track; then one row per case."""
    head = (
        "| | cases | function pass@1 | pass@1 (ties worst) | pass@5 | component acc | commit acc | engine runs | tokens "
        "| wall s | CPU s | errors |"
    )
    lines = [
        f"# Benchmark results: agent `{results['config']['agent']}`, llm `{results['config']['llm']}`"
        + (f", ablated `{','.join(results['config']['ablate'])}`" if results["config"].get("ablate") else ""),
        "",
        *([cpu_line(results.get("cpu")), ""] if results.get("cpu") else []),
        head,
        "|" + "---|" * 12,
        _md_row("**overall**", results["overall"]),
    ]
    lines += [_md_row(name, agg) for name, agg in results["by_category"].items()]
    lines += ["", head.replace("| |", "| subject |", 1), "|" + "---|" * 12]
    lines += [_md_row(name, agg) for name, agg in results["by_subject"].items()]
    lines += ["", head.replace("| |", "| track |", 1), "|" + "---|" * 12]
    lines += [_md_row(name, agg) for name, agg in results.get("by_track", {}).items()]
    lines += [
        "",
        "| case | category | rank | rank (ties worst) | pass@1 | pass@5 | component | commit | engine runs | tokens "
        "| wall s | CPU s |",
        "|" + "---|" * 12,
    ]
    for c in results["cases"]:
        lines.append(
            f"| {c['case']} | {c['category']} | {c['rank'] or '-'} | {c.get('rank_worst') or '-'} | "
            f"{c['pass_at_1']:.2f} | "
            f"{c['pass_at_5']:.2f} | {c['component']:.2f} | {_fmt(c['commit'])} | {c['engine_runs']:.1f} | "
            f"{c['tokens']:.0f} | {c['wall_s']:.1f} | {c.get('cpu_s', 0.0):.1f} |" + (" error" if c["errors"] else "")
        )
    return "\n".join(lines) + "\n"


def cpu_line(cpu: dict | None) -> str:
    """results.json's "cpu" -> the line under the title: CPU s total / per case, projected quiet wall. Pure."""
    if not cpu:
        return ""
    return (
        f"CPU s total / per case: {cpu['total_s']:.1f} / {cpu['per_case_s']:.1f} (longest case "
        f"{cpu['longest_case_s']:.1f}); projected wall on {cpu['workers']} quiet cores with --workers "
        f"{cpu['workers']}: {cpu['projected_quiet_wall_s'] / 60:.1f} min (max of total / workers and the longest case)"
    )


def _md_row(name: str, agg: dict) -> str:
    return (
        f"| {name} | {agg['cases']} | {agg['pass_at_1']:.2f} | {agg.get('pass_at_1_ties', float('nan')):.2f} | "
        f"{agg['pass_at_5']:.2f} | {agg['component_acc']:.2f} | "
        f"{_fmt(agg['commit_acc'])} | {agg['engine_runs']:.1f} | {agg['tokens']:.0f} | {agg['wall_s']:.1f} | "
        f"{agg.get('cpu_s', 0.0):.1f} | {agg['errors']} |"
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot_by_category(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {"overall": results["overall"], **results["by_category"]}
    metrics = [("pass_at_1", "function pass@1"), ("pass_at_5", "function pass@5"), ("component_acc", "component acc")]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(rows)), 4))
    width = 0.8 / len(metrics)
    for i, (key, label) in enumerate(metrics):
        ax.bar([x + i * width for x in range(len(rows))], [r[key] for r in rows.values()], width, label=label)
    ax.set_xticks([x + width for x in range(len(rows))], [f"{k}\n(n={r['cases']})" for k, r in rows.items()])
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of cases")
    ax.set_title(f"diffdx benchmark: agent {results['config']['agent']}, llm {results['config']['llm']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def case_listing(cases: list[Case]) -> str:
    """One line per case: id, issue number, subject, category, title. Pure."""
    width = max((len(c.id) for c in cases), default=2)
    lines = [f"{'id':<{width}}  {'issue':>6}  {'subject':<12}  {'category':<19}  title"]
    lines += [f"{c.id:<{width}}  {c.issue_number:>6}  {c.subject:<12}  {c.category:<19}  {c.title}" for c in cases]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmark.run", description="Diagnose benchmark cases and score them.", epilog=EPILOG
    )
    ap.add_argument("cases", nargs="*", help="case ids (default: every case in --cases-dir)")
    ap.add_argument("--cases-dir", type=Path, help="folder of cases (default: the bundled ones)")
    ap.add_argument("--list", action="store_true", help="list the cases (id, issue, category, title) and exit")
    ap.add_argument("--agent", default="full", help=f"{' | '.join(AGENTS)} | module:function")
    ap.add_argument("--llm", default="none", choices=LLMS)
    ap.add_argument("--model", help=f"LLM model name (default $DIFFDX_LLM_MODEL or {agent_config.DEFAULT_MODEL})")
    ap.add_argument("--config", type=Path, help="TOML file of the diagnosis's RunConfig fields (budgets, timeouts)")
    ap.add_argument("--max-engine-runs", type=int, help="engine runs each diagnosis may spend (budget)")
    ap.add_argument("--max-wall-s", type=float, help="seconds each diagnosis may take (budget)")
    ap.add_argument("--verify-top", type=int, help="suspects each diagnosis checks by counterfactual")
    ap.add_argument(
        "--ablate", default="", help="full pipeline with parts off, comma-separated: taps, drilldown, coverage, bisect"
    )
    ap.add_argument("--workers", type=int, default=1, help="parallel diagnoses (local processes or Ray tasks)")
    ap.add_argument("--ray", action="store_true", help="run diagnoses as Ray tasks on a local Ray started here")
    ap.add_argument("--ray-address", help="run diagnoses as Ray tasks on this running cluster (default $RAY_ADDRESS)")
    ap.add_argument("--samples", type=int, default=1, help="runs per case, for stochastic (LLM) agents")
    ap.add_argument(
        "--costs-from",
        type=Path,
        help="an earlier run's results.json: start the cases it measured as costliest first (default: a prior)",
    )
    ap.add_argument("--out", type=Path, help="output folder (required unless --list)")
    ap.add_argument("--quiet", action="store_true", help="no live status line on stderr")
    ap.add_argument("--keep-temp", action="store_true", help="keep each engine run's folder (/tmp/diffdx-run-*)")
    args = ap.parse_args(argv)
    if not args.list and args.out is None:
        ap.error("--out DIR is required (or --list)")
    return args


def diagnosis_config(args: argparse.Namespace) -> agent_config.RunConfig:
    """Each diagnosis's config: the --config file, then the flags given, the endpoint from the environment."""
    budgets = {"max_engine_runs": args.max_engine_runs, "max_wall_s": args.max_wall_s, "verify_top": args.verify_top}
    settings = agent_config.Settings.from_env()
    cfg = agent_config.RunConfig.from_file(args.config, settings, llm=args.llm, model=args.model, **budgets)
    if cfg.llm == "openai" and not cfg.endpoint.configured:
        raise BadInput("--llm openai needs OPENAI_BASE_URL (and OPENAI_API_KEY) set")
    return cfg


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    from tools.engines.runner import end_cleanly

    end_cleanly(args.keep_temp)
    try:
        if args.list:
            print(case_listing(load_cases(args.cases_dir, list(args.cases) or None)))
            return 0
        ablate = tuple(a.strip() for a in args.ablate.split(",") if a.strip())
        cfg = RunConfig(
            out=args.out,
            cases=tuple(args.cases),
            cases_dir=args.cases_dir,
            agent=args.agent,
            llm=args.llm,
            workers=args.workers,
            ray=args.ray,
            ray_address=args.ray_address,
            samples=args.samples,
            diagnosis=diagnosis_config(args),
            ablate=ablate,
            costs_from=args.costs_from,
        )
        with status.live(quiet=args.quiet):
            results = run_benchmark(cfg)
    except (CaseError, AgentLookupError, RayMissingError, ValueError) as e:  # CaseError, RunConfig: ValueError
        raise BadInput(str(e)) from None
    o = results["overall"]
    print(
        f"{o['cases']} cases: pass@1 {o['pass_at_1']:.2f} ({o['pass_at_1_ties']:.2f} with ties at their worst rank), "
        f"pass@5 {o['pass_at_5']:.2f}, "
        f"component {o['component_acc']:.2f}, commit {_fmt(o['commit_acc'])}; see {args.out / 'results.md'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
