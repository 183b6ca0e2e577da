"""Diagnose one issue: reproduce, localize, drill down, bisect, read the source, hypothesize.

    python -m agent.run --issue N [--cases-dir DIR]                      a bundled benchmark case
    python -m agent.run --issue N --repo owner/name --target-source DIR [--repro repro.toml]
    python -m agent.run --issue-file report.md [--repro repro.toml] --target-source DIR
        [--llm none|openai] [--model NAME] [--config run.toml] [--out DIR] [--json]

Writes DIR/report.json (docs/design.md §5), DIR/report.md, DIR/divergence.png and DIR/args.json
(default DIR: out/<issue>). Progress goes to stderr. Exit status (tools/errors.py): 0 not
reproduced, 1 diagnosed (reproduced), 2 bad input (malformed repro or issue, unknown issue
number, bad path or flag), 3 environment failure (a stage or engine failed, GitHub unreachable,
output folder not writable), 4 not reproduced as reported, but the trigger search found another
divergence (a side finding, diagnosed in the report as such; report.json `diagnosis_of` =
"side finding"). `--config` is a TOML file of RunConfig fields (budgets, timeouts).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config import LLMS, RunConfig, Settings, UsageError
from tools import progress
from tools.errors import (
    AGREE,
    BAD_INPUT,
    DIVERGED,
    ENVIRONMENT,
    EPILOG,
    SIDE_FINDING,
    EnvironmentFailure,
    run_cli,
    writable_dir,
)
from tools.scenario import Scenario, ScenarioError


@dataclass(frozen=True)
class Inputs:
    """What the diagnosing side may see: the issue, the repro, the target's source."""

    issue: str  # id used in the report and the default out dir
    issue_text: str
    repro: str | Scenario | None  # repro.toml text or Scenario; None: read from the issue
    repo: Path | None  # git repo of the target (None: no bisect, no source)
    target_source: Path | None  # first on PYTHONPATH for target runs


# --- one diagnosis ---------------------------------------------------------------------------------


def make_session(inputs: Inputs, cfg: RunConfig, stages=None):
    from agent.llm import OpenAIChat, SourceTools
    from agent.nodes import Session, ToolStages, variant_list, variant_runner
    from agent.policies import DeterministicPolicy, LLMPolicy
    from tools.probe.prober import Prober

    prober = Prober(timeout=cfg.engine_timeout_s, device=cfg.device)
    session = Session(cfg, DeterministicPolicy(), prober, inputs.repo, inputs.target_source, stages or ToolStages())
    if cfg.llm == "openai":
        session.llm = OpenAIChat(
            model=cfg.model,
            base_url=cfg.endpoint.base_url,
            api_key=cfg.endpoint.api_key,
            timeout_s=cfg.llm_timeout_s,
            retries=cfg.llm_retries,
            max_calls=cfg.max_llm_calls,
            max_tokens=cfg.max_llm_tokens,
            answer_tokens=cfg.llm_answer_tokens,
        )

        def tools():
            sc = session.scenario
            return SourceTools(inputs.repo, variant_runner(session, sc) if sc else None, variant_list(session, sc))

        session.policy = LLMPolicy(session.llm, tools, inputs.issue_text)
    return session


def diagnose(inputs: Inputs, cfg: RunConfig, out_dir: Path | None = None, progress=None, stages=None) -> dict:
    """Run the graph on `inputs`; write the report files to `out_dir`; return report.json's dict."""
    from tools.engines.runner import prestart

    real = stages is None or getattr(stages, "runs_engines", False)  # ablated ToolStages too; test doubles not
    if real:  # the real stages run engines: their zygotes start while the graph is imported
        prestart([inputs.target_source, None])  # the target's tree, the installed reference
    from agent.graph import build_graph
    from tools.history.gitrepo import worktree_pool
    from tools.report import warm_plotting, write_report

    session = make_session(inputs, cfg, stages)
    graph = build_graph(session)
    if real:  # work for later, done while the orchestrator mostly waits on engine processes
        if inputs.repo is not None and Path(inputs.repo).is_dir():
            from tools.source.index import prefetch_index

            prefetch_index(inputs.repo, include_tests=False)  # read_source's index
        if out_dir is not None:
            warm_plotting()
    state: dict[str, Any] = {
        "issue": inputs.issue,
        "issue_text": inputs.issue_text,
        "repro": inputs.repro,
        "path": [],
        "notes": [],
    }
    final = state
    with worktree_pool():  # bisection steps and counterfactuals reuse one scratch checkout
        for mode, chunk in graph.stream(state, stream_mode=["updates", "values"]):
            if mode == "values":
                final = chunk
            elif progress is not None:
                for node, update in chunk.items():
                    progress(node, update or {})
    report = final["report"]
    if out_dir is not None:
        repro = final.get("reproduction")
        write_report(report, out_dir, repro.probe if repro is not None else None)
    return report


# --- entry points for benchmark.run and agent.triage -----------------------------------------------


def diagnose_case(case_input, out_dir: Path, cfg: RunConfig, stages=None) -> dict:
    """benchmark.run's agent: a CaseInput (issue, scenario, built repo) and the run's config -> report dict.
    `stages`: a replacement for agent.nodes.ToolStages (the ablations, benchmark/ablations.py)."""
    inputs = Inputs(
        str(case_input.issue_number),
        case_input.issue,
        case_input.scenario,
        Path(case_input.repo),
        Path(case_input.repo),
    )
    return diagnose(inputs, cfg, Path(out_dir), stages=stages)


def diagnose_for_triage(issue: dict, scenario: Scenario | None, settings: Settings | None = None) -> dict | None:
    """agent.triage's Diagnoser: the installed engine (or $DIFFDX_TARGET_SOURCE) on the scenario
    triage read from the issue; None when there is no scenario."""
    if scenario is None:
        return None
    settings = settings or Settings.from_env()
    source = settings.target_source
    text = f"{issue.get('title') or ''}\n\n{issue.get('body') or ''}"
    use_llm = settings.triage_llm and settings.endpoint.base_url
    cfg = RunConfig(
        llm="openai" if use_llm else "none",
        model=settings.model(),
        llm_answer_tokens=settings.llm_answer_tokens,
        endpoint=settings.endpoint,
    )
    return diagnose(Inputs(str(issue.get("number", "issue")), text, scenario, source, source), cfg)


# --- CLI -------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m agent.run", description=__doc__.split("\n\n")[0], epilog=EPILOG)
    ap.add_argument("--issue", type=int, help="issue number: a bundled case's, or a GitHub issue with --repo")
    ap.add_argument("--issue-file", type=Path, help="the bug report as a text/markdown file")
    ap.add_argument("--repo", help="owner/name: read issue N from GitHub (token from $GITHUB_TOKEN)")
    ap.add_argument("--repro", type=Path, help="repro.toml (authoritative scenario)")
    ap.add_argument("--target-source", type=Path, help="source tree of the engine under test (a git repo to bisect)")
    ap.add_argument("--cases-dir", type=Path, help="benchmark cases (default: the bundled ones)")
    ap.add_argument("--llm", choices=LLMS, default="none")
    ap.add_argument("--model", help="LLM model name (default $DIFFDX_LLM_MODEL or gpt-4o-mini)")
    ap.add_argument("--config", type=Path, help="TOML file of RunConfig fields (budgets, timeouts)")
    ap.add_argument("--out", type=Path, help="output dir (default out/<issue>)")
    ap.add_argument("--json", action="store_true", help="print report.json to stdout")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr (the live line and the stage lines)")
    ap.add_argument("--keep-temp", action="store_true", help="keep each engine run's folder (/tmp/diffdx-run-*)")
    args = ap.parse_args(argv)
    if (args.issue is None) == (args.issue_file is None):
        ap.error("give exactly one of --issue N or --issue-file FILE")
    return args


def read_text(path: Path, what: str) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if not text.strip():
        raise UsageError(f"{what} {path} is empty")
    return text


def read_repro(path: Path | None) -> Scenario | None:
    """The repro file, checked now, so a malformed one is a clear error before any work."""
    from tools.scenario import load

    if path is None:
        return None
    try:
        return load(path)
    except ScenarioError as e:
        raise UsageError(f"malformed repro {path}: {e}") from None


def source_dir(path: Path | None, needed_for: str) -> Path:
    if path is None:
        raise UsageError(f"{needed_for} needs --target-source DIR (the engine's source tree)")
    if not path.exists():
        raise UsageError(f"--target-source {path} does not exist")
    if not path.is_dir():
        raise UsageError(f"--target-source {path} is not a directory")
    return path.resolve()


def checked_scenario(inputs: Inputs, llm: str) -> Scenario | None:
    """The scenario the run will use, checked before any engine starts: the repro, or (no LLM)
    the one read from the issue, whose missing fields are named. None: the LLM will read it."""
    from tools.preflight import preflight
    from tools.triage.extract import extract_scenario, require_scenario

    scenario = inputs.repro if isinstance(inputs.repro, Scenario) else None
    if scenario is None and llm == "none":
        scenario = require_scenario(extract_scenario("", inputs.issue_text)[0])
    if scenario is not None:
        check_good_ref(scenario.good_ref, inputs.repo)  # a subprocess or two: before preflight's workers
        preflight(scenario, inputs.target_source)
    return scenario


def check_good_ref(good_ref: str | None, repo: Path | None) -> None:
    """good_ref bounds the bisection: in a tree that is no git repo, or naming no commit there, it would be
    dropped without a word (the report's "not run")."""
    import subprocess

    if not good_ref or repo is None:
        return
    git = ["git", "-C", str(repo)]
    inside = subprocess.run([*git, "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True)
    if inside.returncode != 0:
        raise UsageError(
            f"good_ref = {good_ref!r} needs a git history to bisect, and --target-source {repo} is not in a git "
            "repository; give the engine's checkout, or drop good_ref"
        )
    known = subprocess.run([*git, "rev-parse", "--verify", "--quiet", f"{good_ref}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        raise UsageError(f"good_ref = {good_ref!r} names no commit in {repo} (git rev-parse); check the ref")


def find_case(cases_dir: Path | None, number: int):
    """The case with `issue_number` == number; a broken sibling case does not hide the others."""
    from benchmark.cases import BUNDLED_CASES_DIR, CaseError, load_case

    root = Path(cases_dir) if cases_dir else BUNDLED_CASES_DIR
    if not root.is_dir():
        raise UsageError(f"cases dir {root} does not exist")
    known, broken = {}, []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        try:
            case = load_case(folder)
        except CaseError as e:
            broken.append(str(e))
            continue
        if case.issue_number == number:
            return case
        known[case.issue_number] = case.id
    listing = ", ".join(f"{n} ({i})" for n, i in sorted(known.items())) or "none"
    hint = f"; unreadable cases: {'; '.join(broken)}" if broken else ""
    raise UsageError(f"no benchmark case has issue number {number}; known: {listing}{hint}")


def case_inputs(args, stack: ExitStack) -> Inputs:
    """--issue N: the bundled case with that issue number, its repo built in a temp dir."""
    from benchmark.build import build_case_repo
    from benchmark.cases import case_input

    if args.target_source is not None:  # the case's own repo is the target: a tree given here would never run
        raise UsageError(
            f"--target-source is not used with --issue {args.issue} (a bundled case is diagnosed in the repo "
            "it builds); to diagnose your tree, give the report as --issue-file FILE (or --repo OWNER/NAME)"
        )
    case = find_case(args.cases_dir, args.issue)
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"diffdx-{args.issue}-")))
    ci = case_input(case, build_case_repo(case, tmp / "repo"))
    repro = read_repro(args.repro) or ci.scenario
    return Inputs(str(ci.issue_number), ci.issue, repro, ci.repo, ci.repo)


def github_inputs(args, settings: Settings) -> Inputs:
    from tools.triage.github import DEFAULT_API, GitHub, GitHubError

    source = source_dir(args.target_source, "--repo")
    gh = GitHub(base_url=settings.github_api_url or DEFAULT_API, token=settings.github_token)
    try:
        issue = gh.get_issue(args.repo, args.issue)
    except EnvironmentFailure:  # the host could not be reached: say so, not "empty"
        raise
    except GitHubError as e:
        raise UsageError(f"cannot read {args.repo}#{args.issue}: {e}") from None
    text = f"{issue.get('title') or ''}\n\n{issue.get('body') or ''}"
    if not text.strip():
        raise UsageError(f"{args.repo}#{args.issue} has no title and no body: nothing to diagnose")
    return Inputs(str(args.issue), text, read_repro(args.repro), source, source)


def file_inputs(args) -> Inputs:
    source = source_dir(args.target_source, "--issue-file")
    return Inputs(
        args.issue_file.stem, read_text(args.issue_file, "issue file"), read_repro(args.repro), source, source
    )


def gather_inputs(args, stack: ExitStack, settings: Settings) -> Inputs:
    if args.issue_file is not None:
        return file_inputs(args)
    if args.repo:
        return github_inputs(args, settings)
    return case_inputs(args, stack)


def progress_printer(console):
    def show(node: str, update: dict) -> None:
        detail = update.get("error") or update.get("stopped") or summary_of(node, update)
        mark = "[red]✗[/red]" if update.get("error") else "[green]✓[/green]"
        console.print(f"{mark} {node}" + (f": {detail}" if detail else ""), highlight=False, soft_wrap=True)

    return show


def summary_of(node: str, update: dict) -> str:
    """One progress line per node. Pure."""
    if node == "reproduce" and update.get("reproduction") is not None:
        r = update["reproduction"]
        if r.reproduced and not getattr(r, "on_issue", True):
            return f"not reproduced as reported; side finding with {r.trigger}"
        return (
            ("reproduced" + (f" with {r.trigger}" if r.trigger else " as given")) if r.reproduced else "not reproduced"
        )
    if node == "localize" and update.get("first_divergence"):
        return f"first divergence at {update['first_divergence']['tap']}"
    if node == "drill_down" and update.get("drill") is not None:
        return f"{update['drill'].component}" + (f", kernel {update['drill'].kernel}" if update["drill"].kernel else "")
    if node == "bisect":
        c = update.get("culprit")
        return f"first bad commit {c.sha[:10]} {c.subject}" if c else "no culprit"
    if node in ("hypothesize", "verify"):
        hyps = update.get("hypotheses") or []
        return f"{len(hyps)} candidates" + (f", top {hyps[0].function}" if hyps else "")
    return ""


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


def _main(argv: list[str] | None) -> int:
    from rich.console import Console

    args = parse_args(sys.argv[1:] if argv is None else argv)
    from tools.engines.runner import end_cleanly

    end_cleanly(args.keep_temp)
    console = Console(stderr=True)
    settings = Settings.from_env()
    cfg = RunConfig.from_file(args.config, settings, llm=args.llm, model=args.model)
    if cfg.llm == "openai" and not cfg.endpoint.configured:
        raise UsageError("--llm openai needs OPENAI_BASE_URL (and OPENAI_API_KEY) set")
    if args.out is not None:
        writable_dir(args.out)  # a bad --out fails before the case is built
    with ExitStack() as stack:
        inputs = gather_inputs(args, stack, settings)
        checked_scenario(inputs, cfg.llm)
        out = writable_dir(args.out or Path("out") / inputs.issue)
        write_args(out, args, cfg)
        with progress.live(quiet=args.quiet, console=console), progress.task(f"diagnosing issue {inputs.issue}"):
            report = diagnose(inputs, cfg, out, None if args.quiet else progress_printer(console))
    return finish(report, out, args.json, console)


def write_args(out: Path, args, cfg: RunConfig) -> None:
    """The run's record (STYLE §12): flags and config next to the report."""
    out.mkdir(parents=True, exist_ok=True)
    flags = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    (out / "args.json").write_text(json.dumps({"args": flags, "config": cfg.record()}, indent=2) + "\n")


def finish(report: dict, out: Path, as_json: bool, console) -> int:
    if as_json:
        print(json.dumps(report, indent=2))
    if report.get("error"):
        console.print(f"[red]error:[/red] {report['error']} (partial report in {out})", highlight=False, soft_wrap=True)
        return BAD_INPUT if report.get("error_kind") == "bad input" else ENVIRONMENT
    if report.get("diagnosis_of") == "side finding":
        side = report["side_findings"][0]
        console.print(
            f"not reproduced as reported; another divergence was found while searching "
            f"({side['trigger']}: {side['why']}); report in {out}",
            highlight=False,
            soft_wrap=True,
        )
        return SIDE_FINDING
    if not report.get("reproduced"):
        console.print(f"not reproduced; report in {out}", highlight=False, soft_wrap=True)
        return AGREE
    top = (report.get("hypotheses") or [{}])[0]
    console.print(
        f"diagnosed: {top.get('function', 'no hypothesis')} in {top.get('file', '-')}; report in {out}", highlight=False
    )
    return DIVERGED


if __name__ == "__main__":
    sys.exit(main())
