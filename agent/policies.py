"""Policies: the judgment calls of a diagnosis, made by rules or by an LLM (docs/design.md §7).

Both drive the same graph. The LLM policy asks the model and checks every answer; on a
timeout, rate limit, malformed tool call or garbage JSON it retries once, then takes the
deterministic answer for that step and records the fallback (`fallbacks`, reported as
`llm_fallbacks`). Measurement outranks opinion in `rank`: a verified hypothesis is never
placed below an unverified one, the model only orders candidates that carry evidence, and
it may add at most one new candidate (an existing symbol of the source index), ranked below
every evidenced one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from agent.llm import LLM, LLMBudgetSpent, LLMError, ToolBox, render
from tools.engines import DEFAULT_ENGINE
from tools.hypotheses.evidence import CATEGORIES, Hypothesis
from tools.scenario import Scenario, ScenarioError, from_dict, loads

MAX_ISSUE_CHARS = 20_000  # longer issue text is cut before it reaches a prompt
MAX_TEXT = 600  # characters kept of one LLM explanation / fix
NEW_CANDIDATE_CONFIDENCE = 0.1


class Policy(Protocol):
    fallbacks: list[dict]

    def read_issue(self, issue_text: str, repro: str | Scenario | None) -> Scenario | None:
        """The scenario to run: the repro (authoritative) if given, else read from the issue."""

    def order_triggers(self, scenario: Scenario, repro_state: dict, names: list[tuple[str, str]]) -> list[str]:
        """Variant names to try first ([] = the stage's own cheapest-first order)."""

    def rank(self, hypotheses: list[Hypothesis], context: dict) -> list[Hypothesis]:
        """The candidates best first; verified ones always ahead of unverified ones."""

    def propose_patch(self, suspect: dict) -> str | None:
        """A unified diff that might fix the suspect (None: no proposal); the probe decides if it does."""


# --- pure pieces ---------------------------------------------------------------------------------


def scenario_from_repro(repro: str | Scenario) -> Scenario:
    return repro if isinstance(repro, Scenario) else loads(repro)


def scenario_from_rules(issue_text: str) -> tuple[dict, list[str], Scenario | None]:
    """(partial scenario, what is missing, runnable Scenario or None) from the issue's text."""
    from tools.triage.extract import extract_scenario, to_scenario

    partial, missing = extract_scenario("", issue_text[:MAX_ISSUE_CHARS])
    return partial, missing, to_scenario(partial)


def measurement_first(hypotheses: list[Hypothesis]) -> list[Hypothesis]:
    """Stable: verified, then evidenced, then the rest, each group in its given order."""
    return sorted(hypotheses, key=lambda h: (not h.verified, not h.evidence))


def valid_patch(answer: dict) -> str | None:
    """The answer's unified diff, None if it proposes none; anything else is malformed."""
    patch = answer.get("patch")
    if patch is None:
        return None
    if not isinstance(patch, str) or "@@" not in patch or "+++ " not in patch:
        raise ValueError("'patch' must be a unified diff (---/+++ headers and @@ hunks) or null")
    return patch


def variant_name(entry) -> tuple[str, str]:
    """A variant listing entry, (name, description) or "name: description", -> the pair."""
    if isinstance(entry, (tuple, list)):
        return str(entry[0]), str(entry[1]) if len(entry) > 1 else ""
    name, _, description = str(entry).partition(":")
    return name.strip(), description.strip()


def valid_order(answer: dict, names: list[str]) -> list[str]:
    """The model's {"order": [...]} restricted to known names, deduplicated; ValueError if none."""
    order = answer.get("order")
    if not isinstance(order, list):
        raise ValueError("answer has no `order` list")
    kept = list(dict.fromkeys(n for n in order if isinstance(n, str) and n in names))
    if not kept:
        raise ValueError(f"`order` names no known variant: {order!r:.200}")
    return kept


def constrain_ranking(cands: list[Hypothesis], answer: dict, index=None) -> list[Hypothesis]:
    """Apply a model's ranking answer under the invariants (see module doc). Pure but for
    `index.find`; ValueError when the answer is unusable."""
    order = answer.get("order")
    if not isinstance(order, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in order):
        raise ValueError("answer has no `order` list of candidate ids")
    chosen = list(dict.fromkeys(i for i in order if 0 <= i < len(cands)))
    if cands and not chosen:
        raise ValueError(f"`order` names no candidate: {order!r:.200}")
    ranked = [_annotated(cands[i], i, answer) for i in chosen]
    ranked += [cands[i] for i in range(len(cands)) if i not in chosen]
    evidenced = [h for h in measurement_first(ranked) if h.evidence]
    new = _new_candidate(answer.get("new_candidate"), cands, index)
    return evidenced + ([new] if new else []) + [h for h in cands if not h.evidence]


def _annotated(h: Hypothesis, i: int, answer: dict) -> Hypothesis:
    texts = {
        key: (answer.get(key) or {}).get(str(i)) if isinstance(answer.get(key), dict) else None
        for key in ("explanations", "fixes")
    }
    changes: dict[str, Any] = {}
    if isinstance(texts["explanations"], str) and texts["explanations"].strip():
        changes["explanation"] = texts["explanations"].strip()[:MAX_TEXT]
    if isinstance(texts["fixes"], str) and texts["fixes"].strip():
        changes["suggested_fix"] = texts["fixes"].strip()[:MAX_TEXT]
    return replace(h, **changes) if changes else h


def _new_candidate(proposal, cands: list[Hypothesis], index) -> Hypothesis | None:
    """The model's extra candidate, if it names an existing symbol not already a candidate."""
    if not isinstance(proposal, dict) or index is None or not isinstance(proposal.get("function"), str):
        return None
    file = proposal.get("file") if isinstance(proposal.get("file"), str) else ""
    symbols = [s for s in index.find(proposal["function"]) if not file or s.file == file]
    if not symbols or symbols[0].kind == "class":
        return None
    s = symbols[0]
    if any(h.file == s.file and h.function == s.qualname for h in cands):
        return None
    category = str(proposal["category"]) if proposal.get("category") in CATEGORIES else "numerics"
    why = str(proposal.get("explanation") or "")[:MAX_TEXT]
    return Hypothesis(
        file=s.file,
        function=s.qualname,
        commit=None,
        category=category,
        confidence=NEW_CANDIDATE_CONFIDENCE,
        explanation=why,
        evidence=[f"proposed by the LLM from reading {s.file}:{s.start_line} (not measured)"],
    )


# --- the policies --------------------------------------------------------------------------------


class DeterministicPolicy:
    """Rules only: the repro as given, the stage's own trigger order, the measured ranking."""

    def __init__(self):
        self.fallbacks: list[dict] = []

    def read_issue(self, issue_text: str, repro: str | Scenario | None) -> Scenario | None:
        if repro is not None:
            return scenario_from_repro(repro)
        return scenario_from_rules(issue_text)[2]

    def order_triggers(self, scenario: Scenario, repro_state: dict, names: list) -> list[str]:
        return []

    def rank(self, hypotheses: list[Hypothesis], context: dict) -> list[Hypothesis]:
        return measurement_first(hypotheses)

    def propose_patch(self, suspect: dict) -> str | None:
        return None  # the fix templates (tools/hypotheses/fixes.py) are the rules' proposals


class LLMPolicy:
    """Asks an `LLM`; per step, retry once then fall back to `DeterministicPolicy`."""

    def __init__(self, llm: LLM, tools: Callable[[], ToolBox | None] = lambda: None, issue_text: str = ""):
        self.llm, self.tools, self.issue = llm, tools, issue_text[:MAX_ISSUE_CHARS]
        self.rules = DeterministicPolicy()
        self.fallbacks: list[dict] = []

    def read_issue(self, issue_text: str, repro: str | Scenario | None) -> Scenario | None:
        if repro is not None:  # authoritative: the model is not asked
            return scenario_from_repro(repro)
        partial, missing, scenario = scenario_from_rules(issue_text)
        if scenario is not None and not missing:
            return scenario

        def parse(answer: dict) -> Scenario:
            from agent.triage_llm import merge_extraction

            data = merge_extraction(partial, answer)
            data = {k: v for k, v in data.items() if k != "meta"}
            data["target"] = {"engine": DEFAULT_ENGINE, **(data.get("target") or {})}
            return from_dict(data)

        prompt = render("read_issue.j2", partial=partial, missing=missing, issue=issue_text[:MAX_ISSUE_CHARS])
        return self._ask("read_issue", prompt, parse, lambda: scenario, tools=False)

    def order_triggers(self, scenario: Scenario, repro_state: dict, names: list) -> list[str]:
        pairs = [variant_name(n) for n in names]
        if not pairs:
            return []
        prompt = render(
            "order_triggers.j2",
            engine=scenario.target.engine,
            dtype=scenario.target.dtype,
            n_requests=len(scenario.requests),
            scenario=scenario.to_dict(),
            variants=pairs,
            probe_summary=repro_state.get("probe_summary") or "",
            issue=self.issue,
        )
        return self._ask(
            "order_triggers",
            prompt,
            lambda a: valid_order(a, [n for n, _ in pairs]),
            lambda: self.rules.order_triggers(scenario, repro_state, names),
        )

    def rank(self, hypotheses: list[Hypothesis], context: dict) -> list[Hypothesis]:
        if not hypotheses:
            return []
        view = [
            {
                "id": i,
                "file": h.file,
                "function": h.function,
                "category": h.category,
                "score": h.score,
                "verified": h.verified,
                "commit": h.commit,
                "evidence": h.evidence[:6],
            }
            for i, h in enumerate(hypotheses)
        ]
        prompt = render(
            "rank_hypotheses.j2",
            candidates=view,
            issue=self.issue,
            first_divergence=context.get("first_divergence"),
            pattern=context.get("pattern") or {},
            kernel=context.get("kernel"),
            commit=context.get("commit"),
        )
        return self._ask(
            "rank",
            prompt,
            lambda a: constrain_ranking(hypotheses, a, context.get("index")),
            lambda: self.rules.rank(hypotheses, context),
        )

    def propose_patch(self, suspect: dict) -> str | None:
        prompt = render("propose_patch.j2", **suspect)
        return self._ask("propose_patch", prompt, valid_patch, lambda: None, tools=False)

    def _ask(
        self,
        step: str,
        prompt: str,
        parse: Callable[[dict], object],
        fallback: Callable[[], object],
        tools: bool = True,
    ):
        errors: list[Exception] = []
        for _attempt in range(2):
            try:
                answer = self.llm.ask(render("system.j2"), prompt, self.tools() if tools else None)
                return parse(answer)
            except LLMBudgetSpent as e:
                errors.append(e)
                break  # retrying cannot help
            except (LLMError, ScenarioError, ValueError, TypeError, KeyError, AttributeError) as e:
                errors.append(e)
        last = errors[-1]
        self.fallbacks.append(
            {
                "step": step,
                "reason": getattr(last, "kind", "invalid_answer"),
                "detail": f"{type(last).__name__}: {last}"[:300],
                "attempts": len(errors),
            }
        )
        return fallback()
