"""The diagnosis loop as a langgraph StateGraph (docs/design.md "The flow"). Wiring only.

intake -> triage -> reproduce -> localize -> drill_down -> bisect -> read_source
       -> hypothesize -> verify -> report
Shortcuts: an error, or a spent budget, goes straight to report; not reproduced -> report;
no good ref -> skip bisect; no target repo -> nothing to read or bisect, report.
"""

from __future__ import annotations

from functools import partial

from langgraph.graph import END, START, StateGraph

from agent import nodes
from agent.nodes import DiagnosisState, Session

FLOW = (
    "intake",
    "triage",
    "reproduce",
    "localize",
    "drill_down",
    "bisect",
    "read_source",
    "hypothesize",
    "verify",
    "report",
)


def halted(state: DiagnosisState) -> bool:
    return bool(state.get("error") or state.get("stopped"))


def after_triage(state: DiagnosisState) -> str:
    return "report" if halted(state) or state.get("scenario") is None else "reproduce"


def after_reproduce(state: DiagnosisState) -> str:
    repro = state.get("reproduction")
    return "report" if halted(state) or repro is None or not repro.reproduced else "localize"


def after_drill_down(state: DiagnosisState, has_repo: bool) -> str:
    if halted(state) or not has_repo:
        return "report"
    return "bisect" if state.get("good_ref") else "read_source"


def unless_halted(next_node: str):
    return lambda state: "report" if halted(state) else next_node


def build_graph(session: Session):
    g = StateGraph(DiagnosisState)
    for name in FLOW:
        g.add_node(name, partial(nodes.guarded(name, getattr(nodes, name)), session=session))
    g.add_edge(START, "intake")
    g.add_conditional_edges("intake", unless_halted("triage"), ["triage", "report"])
    g.add_conditional_edges("triage", after_triage, ["reproduce", "report"])
    g.add_conditional_edges("reproduce", after_reproduce, ["localize", "report"])
    g.add_conditional_edges("localize", unless_halted("drill_down"), ["drill_down", "report"])
    g.add_conditional_edges(
        "drill_down", partial(after_drill_down, has_repo=session.repo is not None), ["bisect", "read_source", "report"]
    )
    g.add_conditional_edges("bisect", unless_halted("read_source"), ["read_source", "report"])
    g.add_conditional_edges("read_source", unless_halted("hypothesize"), ["hypothesize", "report"])
    g.add_conditional_edges("hypothesize", unless_halted("verify"), ["verify", "report"])
    g.add_edge("verify", "report")
    g.add_edge("report", END)
    return g.compile()
