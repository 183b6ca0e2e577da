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
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypedDict, TypeVar

from agent.config import RunConfig
from agent.policies import Policy, variant_name
from tools.errors import BadInput
from tools.hypotheses.evidence import Culprit, DrillDown, Hypothesis, Reproduction
from tools.scenario import Scenario

if TYPE_CHECKING:
    from agent.llm import LLM

T = TypeVar("T")
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
    error_kind: str | None  # "bad input": a stage refused what it was given (exit 2, not 3)
    stopped: str | None  # why the budget ended the diagnosis early
    path: Annotated[list[str], operator.add]
    notes: Annotated[list[str], operator.add]


class Stages(Protocol):
    """The measuring stages (tools/); `ToolStages` is the real one."""

    def variant_names(self, scenario: Scenario, target_source: Path | None = None) -> list: ...

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

    runs_engines = True  # they start engine processes: diagnose() starts zygotes and warms caches ahead

    def variant_names(self, scenario, target_source=None):
        from tools.reproduce import variant_names

        return variant_names(scenario, target_source)

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
                "error_kind": "bad input" if isinstance(e, BadInput) else None,
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


def routed(value: T | None, what: str) -> T:
    """A value the graph's routing guarantees here (agent.graph routes to a node only once it exists)."""
    if value is None:
        raise RuntimeError(f"no {what} at this node: the graph's routing is wrong")
    return value


def reproduce(state: DiagnosisState, session: Session) -> dict:
    scenario = routed(state["scenario"], "scenario")
    names = session.stages.variant_names(scenario, session.target_source)
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
    probe = routed(state["reproduction"], "reproduction").probe
    first = probe.first.to_dict() if probe is not None and probe.first is not None else None
    notes = [] if first else [f"no tap crosses the threshold: {probe.summary if probe else 'no probe'}"]
    return {"first_divergence": first, "notes": notes}


def drill_down(state: DiagnosisState, session: Session) -> dict:
    repro = routed(state["reproduction"], "reproduction")
    return {"drill": session.stages.drill_down(repro, session.prober, session.target_source)}


def bisect(state: DiagnosisState, session: Session) -> dict:
    repo, repro = routed(session.repo, "repo"), routed(state["reproduction"], "reproduction")
    culprit = session.stages.find_culprit(repo, state.get("good_ref"), repro, session.prober)
    return {"culprit": culprit, "notes": [] if culprit else ["bisection found no culprit commit"]}


def read_source(state: DiagnosisState, session: Session) -> dict:
    from tools.source.index import open_index

    return {"index": open_index(routed(session.repo, "repo"), include_tests=False)}


def hypothesize(state: DiagnosisState, session: Session) -> dict:
    repo, repro = routed(session.repo, "repo"), routed(state["reproduction"], "reproduction")
    cands = session.stages.hypothesize(
        repo, state["index"], repro, state.get("drill"), state.get("culprit"), session.prober
    )
    return {"hypotheses": cands}


def verify(state: DiagnosisState, session: Session) -> dict:
    """Counterfactual checks, then the policy's ranking, which sees what was verified or refuted."""
    checked = session.stages.verify(
        routed(session.repo, "repo"),
        state["hypotheses"],
        routed(state["reproduction"], "reproduction"),
        session.prober,
        state.get("culprit"),
        top=session.config.verify_top,
    )
    return {"hypotheses": session.policy.rank(patch_suspects(state, session, checked), rank_context(state))}


LLM_PATCH_TOP = 2  # leading unverified suspects the policy is asked to patch


def patch_suspects(state: DiagnosisState, session: Session, hypotheses: list) -> list:
    """The policy's patches for the leading suspects (an LLM's; the rules propose none), each
    verified by re-probing like any other edit: a patch counts only if the divergence goes."""
    propose = getattr(session.policy, "propose_patch", None)
    if propose is None or session.repo is None or any(h.verified for h in hypotheses) or session.budget_spent():
        return hypotheses
    from tools.hypotheses.verify import verify_patch

    repro = routed(state["reproduction"], "reproduction")
    from tools.source.index import language_of

    for h in [h for h in hypotheses if language_of(h.file)][:LLM_PATCH_TOP]:  # a native tree is rebuilt per probe
        suspect = suspect_view(state, h)
        patch = propose(suspect) if suspect else None
        if patch and verify_patch(session.repo, h, repro, session.prober, patch).verified:
            break
    return hypotheses


def suspect_view(state: DiagnosisState, h) -> dict | None:
    """What the patch prompt shows of a suspect: its source, the divergence, the evidence."""
    index, repro, drill = state.get("index"), state["reproduction"], state.get("drill")
    symbol = next((s for s in index.find(h.function) if s.file == h.file), None) if index else None
    if symbol is None or index is None or repro is None or repro.probe is None:
        return None
    return {
        "file": h.file,
        "function": h.function,
        "source": index.read(symbol),
        "language": symbol.language,
        "start_line": symbol.start_line,
        "end_line": symbol.end_line,
        "evidence": [str(e) for e in h.evidence[:6]],
        "divergence": repro.probe.summary,
        "first_divergence": repro.probe.first.to_dict() if repro.probe.first else None,
        "pattern": drill.pattern if drill else {},
    }


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
        "error_kind": state.get("error_kind"),
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
        return [variant_name(v)[0] for v in session.stages.variant_names(scenario, session.target_source)]
    except Exception:  # no trigger stage, no variant tool
        return []
