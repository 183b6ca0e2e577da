"""Graph nodes: `state -> update` functions, each a thin call into a tools/ stage or the policy.

The runtime objects a node needs (config, policy, prober, stages, repo) travel in a `Session`
bound to every node by agent.graph; the state holds only what the diagnosis has found. A
stage that raises ends the diagnosis at the report with the error recorded (`guarded`).
"""

from __future__ import annotations

import operator
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypedDict

from agent.policies import Policy, variant_name
from tools.hypotheses.evidence import Culprit, DrillDown, Hypothesis, Reproduction
from tools.scenario import Scenario

if TYPE_CHECKING:
    from agent.llm import LLM
    from agent.run import RunConfig

VARIANT_TOOL_RUNS = 8  # engine runs one `run_variant` tool call may spend
MAX_VARIANT_TOOL_CALLS = 2


class DiagnosisState(TypedDict, total=False):
    issue: str  # issue id as reported ("1201", "report")
    issue_text: str
    repro: str | Scenario | None  # repro.toml text or a Scenario (authoritative), or None
    scenario: Scenario | None
    good_ref: str | None
    reproduction: Reproduction | None
    first_divergence: dict | None
    drill: DrillDown | None
    culprit: Culprit | None
    index: Any  # tools.source.index.SourceIndex of the target repo
    hypotheses: list[Hypothesis]
    report: dict
    error: str | None
    stopped: str | None  # why the budget ended the diagnosis early
    path: Annotated[list[str], operator.add]
    notes: Annotated[list[str], operator.add]


class Stages(Protocol):
    """The measuring stages (tools/); `ToolStages` is the real one."""

    def variant_names(self, scenario: Scenario) -> list: ...

    def reproduce(
        self,
        scenario: Scenario,
        prober,
        target_source: Path | None,
        *,
        budget_runs: int,
        order: list[str] | None,
        issue_text: str | None = None,
    ) -> Reproduction: ...

    def drill_down(self, repro: Reproduction, prober, target_source: Path | None) -> DrillDown: ...

    def find_culprit(self, repo: Path, good_ref: str | None, repro: Reproduction, prober) -> Culprit | None: ...

    def hypothesize(
        self, repo: Path, index, repro: Reproduction, drill: DrillDown | None, culprit: Culprit | None, prober
    ) -> list[Hypothesis]: ...

    def verify(
        self, repo: Path, cands: list[Hypothesis], repro: Reproduction, prober, culprit: Culprit | None, top: int
    ) -> list[Hypothesis]: ...


class ToolStages:
    """The stages in tools/, imported when first used."""

    def variant_names(self, scenario):
        from tools.reproduce import variant_names

        return variant_names(scenario)

    def reproduce(self, scenario, prober, target_source, *, budget_runs, order, issue_text=None):
        from tools.reproduce import reproduce

        return reproduce(scenario, prober, target_source, budget_runs=budget_runs, order=order, issue_text=issue_text)

    def drill_down(self, repro, prober, target_source):
        from tools.drilldown import drill_down

        return drill_down(repro, prober, target_source)

    def find_culprit(self, repo, good_ref, repro, prober):
        from tools.history.culprit import find_culprit

        return find_culprit(repo, good_ref, repro, prober)

    def hypothesize(self, repo, index, repro, drill, culprit, prober):
        from tools.hypotheses.gather import gather
        from tools.hypotheses.rank import rank

        cands = gather(repo, index, repro, drill, culprit, prober=prober)
        return rank(cands, top=len(cands))  # all of them: verification may lift a low one

    def verify(self, repo, cands, repro, prober, culprit, top):
        from tools.history import release_diff
        from tools.hypotheses.verify import verify

        if release_diff.is_release(cands, culprit):  # a whole release is the culprit: narrow inside its diff
            return release_diff.localize(repo, cands, repro, prober, culprit)[0]
        return verify(repo, cands, repro, prober, culprit, top=top)


@dataclass
class Session:
    config: RunConfig
    policy: Policy
    prober: Any  # tools.probe.prober.Prober (counts engine_runs)
    repo: Path | None  # git repo of the target (bisect, source, diffs)
    target_source: Path | None  # first on PYTHONPATH for target runs
    stages: Stages = field(default_factory=ToolStages)
    llm: LLM | None = None
    started: float = field(default_factory=time.monotonic)
    scenario: Scenario | None = None  # set by triage, for the LLM's run_variant tool
    issue_text: str | None = None  # set by intake: judges whether a variant's divergence is the issue's
    variant_tool_calls: int = 0

    def budget_spent(self) -> str | None:
        """Why no further engine work may start, or None."""
        if self.prober.engine_runs >= self.config.max_engine_runs:
            return f"engine-run budget spent ({self.prober.engine_runs}/{self.config.max_engine_runs})"
        if time.monotonic() - self.started >= self.config.max_wall_s:
            return f"wall-time budget spent ({self.config.max_wall_s:g}s)"
        return None

    def runs_left(self) -> int:
        return max(0, self.config.max_engine_runs - self.prober.engine_runs)


def guarded(name: str, node: Callable[[DiagnosisState, Session], dict]):
    """The node, recording its name in `path`, the budget state, and any exception as `error`."""

    def run(state: DiagnosisState, session: Session) -> dict:
        try:
            update = node(state, session)
        except Exception as e:  # a failed stage still leaves a report
            update = {
                "error": f"{name} failed: {type(e).__name__}: {e}",
                "notes": [traceback.format_exc(limit=6)[-2000:]],
            }
        update["path"] = [name]
        if name != "report" and not update.get("stopped") and (spent := session.budget_spent()):
            update["stopped"] = f"{spent} after {name}"
        return update

    run.__name__ = name
    return run


# --- the nodes -----------------------------------------------------------------------------------


def intake(state: DiagnosisState, session: Session) -> dict:
    text = state.get("issue_text") or ""
    if not text.strip() and state.get("repro") is None:
        return {"error": "the issue is empty and there is no repro: nothing to diagnose"}
    session.issue_text = text
    return {"issue_text": text, "notes": [f"issue {state.get('issue', '?')}: {len(text)} characters"]}


def triage(state: DiagnosisState, session: Session) -> dict:
    scenario = session.policy.read_issue(state.get("issue_text", ""), state.get("repro"))
    if scenario is None:
        return {
            "scenario": None,
            "error": "the issue does not say enough to reproduce it "
            "(diffdx needs at least a model and a prompt); give a repro.toml",
        }
    good_ref, notes = scenario.good_ref, []
    if good_ref and (session.repo is None or not (session.repo / ".git").exists()):
        good_ref, notes = None, [f"good ref {scenario.good_ref!r} given but the target is not a git repo"]
    session.scenario = scenario
    return {"scenario": scenario, "good_ref": good_ref, "notes": notes}


def reproduce(state: DiagnosisState, session: Session) -> dict:
    scenario = state["scenario"]
    names = session.stages.variant_names(scenario)
    order = session.policy.order_triggers(scenario, {"issue": state.get("issue_text", "")}, names)
    budget = min(session.config.trigger_runs, session.runs_left())
    repro = session.stages.reproduce(
        scenario,
        session.prober,
        session.target_source,
        budget_runs=budget,
        order=order or None,
        issue_text=state.get("issue_text") or "",
    )
    notes = [f"side finding (not the reported issue): {f.trigger}: {f.why}" for f in repro.side_findings]
    return {"reproduction": repro, "error": repro.error if not repro.reproduced else None, "notes": notes}


def localize(state: DiagnosisState, session: Session) -> dict:
    probe = state["reproduction"].probe
    first = probe.first.to_dict() if probe is not None and probe.first is not None else None
    notes = [] if first else [f"no tap crosses the threshold: {probe.summary if probe else 'no probe'}"]
    return {"first_divergence": first, "notes": notes}


def drill_down(state: DiagnosisState, session: Session) -> dict:
    return {"drill": session.stages.drill_down(state["reproduction"], session.prober, session.target_source)}


def bisect(state: DiagnosisState, session: Session) -> dict:
    culprit = session.stages.find_culprit(session.repo, state.get("good_ref"), state["reproduction"], session.prober)
    return {"culprit": culprit, "notes": [] if culprit else ["bisection found no culprit commit"]}


def read_source(state: DiagnosisState, session: Session) -> dict:
    from tools.source.index import open_index

    return {"index": open_index(session.repo, include_tests=False)}


def hypothesize(state: DiagnosisState, session: Session) -> dict:
    cands = session.stages.hypothesize(
        session.repo, state["index"], state["reproduction"], state.get("drill"), state.get("culprit"), session.prober
    )
    return {"hypotheses": cands}


def verify(state: DiagnosisState, session: Session) -> dict:
    """Counterfactual checks, then the policy's ranking, which sees what was verified or refuted."""
    checked = session.stages.verify(
        session.repo,
        state["hypotheses"],
        state["reproduction"],
        session.prober,
        state.get("culprit"),
        top=session.config.verify_top,
    )
    return {"hypotheses": session.policy.rank(checked, rank_context(state))}


def report(state: DiagnosisState, session: Session) -> dict:
    from tools.report import build_report, what_ran

    cost = {
        "engine_runs": session.prober.engine_runs,
        "llm_calls": session.llm.usage.calls if session.llm else 0,
        "tokens_in": session.llm.usage.tokens_in if session.llm else 0,
        "tokens_out": session.llm.usage.tokens_out if session.llm else 0,
        "wall_s": round(time.monotonic() - session.started, 3),
    }
    extras = {
        "llm_fallbacks": list(session.policy.fallbacks),
        "path": state.get("path", []) + ["report"],
        "error": state.get("error"),
        "stopped": state.get("stopped"),
        "notes": state.get("notes", []),
        "llm": session.config.llm,
        "model": getattr(session.llm, "model", None),
        "ran": what_ran(getattr(session.prober, "runs", []), session.prober.engine_runs, session.target_source),
    }
    return {
        "report": build_report(
            state.get("issue", ""),
            state.get("reproduction"),
            state.get("drill"),
            state.get("culprit"),
            state.get("hypotheses") or [],
            cost,
            extras,
        )
    }


def rank_context(state: DiagnosisState) -> dict:
    drill, culprit = state.get("drill"), state.get("culprit")
    return {
        "first_divergence": state.get("first_divergence"),
        "index": state.get("index"),
        "pattern": drill.pattern if drill else {},
        "kernel": drill.kernel if drill else None,
        "commit": {"sha": culprit.sha, "subject": culprit.subject} if culprit else None,
    }


def variant_runner(session: Session, scenario: Scenario) -> Callable[[str], str]:
    """The `run_variant` tool: probe one named trigger variant within the engine-run budget."""

    def run(name: str) -> str:
        if session.variant_tool_calls >= MAX_VARIANT_TOOL_CALLS:
            return f"error: at most {MAX_VARIANT_TOOL_CALLS} variant probes per diagnosis"
        if session.runs_left() < VARIANT_TOOL_RUNS:
            return "error: the engine-run budget is spent"
        session.variant_tool_calls += 1
        repro = session.stages.reproduce(
            scenario,
            session.prober,
            session.target_source,
            budget_runs=VARIANT_TOOL_RUNS,
            order=[name],
            issue_text=session.issue_text,
        )
        return (
            "\n".join(
                f"{t.description}: {'DIVERGES' if t.diverged else 'agrees'}; {t.summary}"
                + (f" (not as the issue describes: {t.off_issue})" if getattr(t, "off_issue", None) else "")
                for t in repro.trials
            )
            or "nothing ran"
        )

    return run


def variant_list(session: Session, scenario: Scenario | None) -> list[str]:
    if scenario is None:
        return []
    try:
        return [variant_name(v)[0] for v in session.stages.variant_names(scenario)]
    except Exception:  # no trigger stage, no variant tool
        return []
