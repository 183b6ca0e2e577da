"""Optional LLM help for triage (docs/design.md §7): classify an issue, read a scenario out of it.

Any OpenAI-compatible endpoint via the `openai` client (agent.config.Endpoint: `OPENAI_BASE_URL`,
`OPENAI_API_KEY`).
Every answer is checked; an unusable one returns None and the caller keeps the rules' result.
"""

from __future__ import annotations

import json
import sys

from agent.config import DEFAULT_MODEL, Endpoint
from agent.llm import parse_json_object, render
from tools.triage.rules import LABELS

SCENARIO_KEYS = ("model", "target", "workload", "good_ref", "meta")


def parse_label(text: str | None) -> tuple[str, float] | None:
    obj = parse_json_object(text)
    if not obj or obj.get("label") not in LABELS:
        return None
    try:
        conf = min(1.0, max(0.0, float(obj.get("confidence", 0.5))))
    except (TypeError, ValueError):
        conf = 0.5
    return obj["label"], conf


# The LLM's vote may change the label only with evidence: the rules + model are unsure and the
# LLM is confident. Otherwise it only moves the confidence (up when it agrees, down when not).
FLIP_BELOW = 0.6  # rules + model confidence under which a confident LLM vote may win
LLM_MIN = 0.7  # LLM confidence needed to change the label


def _two_way(p_for: float, p_against: float) -> float:
    """Confidence in a label that one voter gives p_for and the other 1 - p_against. Pure."""
    a, b = p_for * (1.0 - p_against), (1.0 - p_for) * p_against
    return a / (a + b) if a + b else 0.5


def combine_votes(base: dict, llm: tuple[str, float] | None) -> dict:
    """Rules + model result dict (label, confidence, cues) and an optional LLM vote -> result. Pure.

    Agreement raises the confidence; disagreement keeps the base label and lowers its confidence,
    unless the base confidence is below FLIP_BELOW and the LLM's is at least LLM_MIN."""
    if not llm:
        return base
    label, conf = llm
    out = dict(base, llm={"label": label, "confidence": round(conf, 3)})
    p = min(max(float(base["confidence"]), 0.01), 0.99)
    q = min(max(conf, 0.01), 0.99)
    if label == base["label"]:
        out.update(confidence=round(1.0 - (1.0 - p) * (1.0 - q), 3), source="rules+model+llm")
    elif p < FLIP_BELOW and q >= LLM_MIN:
        out.update(label=label, confidence=round(_two_way(q, p), 3), source="llm")
    else:
        out.update(confidence=round(_two_way(p, q), 3), source="rules+model")
    return out


def merge_extraction(rules: dict, llm: dict | None) -> dict:
    """Rules' partial scenario, with keys the rules missed filled from the LLM's. Pure."""
    if not llm:
        return rules
    merged = json.loads(json.dumps(rules))
    for key in SCENARIO_KEYS:
        value = llm.get(key)
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            for k, v in value.items():
                if merged[key].get(k) in (None, {}, []):
                    merged[key][k] = v
        elif value and not merged.get(key):
            merged[key] = value
    return merged


class OpenAITriageLLM:
    def __init__(self, model: str = DEFAULT_MODEL, endpoint: Endpoint | None = None, answer_tokens: int | None = None):
        from openai import OpenAI  # only when an LLM is asked for

        endpoint = endpoint or Endpoint()
        self.client = OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key or "none", max_retries=2)
        self.model = model
        self.answer_tokens = answer_tokens  # max_tokens of each request (None: the endpoint's own limit)

    def ask(self, template: str, **ctx) -> str | None:
        try:
            limit = {"max_tokens": self.answer_tokens} if self.answer_tokens else {}
            resp = self.client.chat.completions.create(
                model=self.model,
                temperature=0.0,
                messages=[{"role": "user", "content": render(template, **ctx)}],
                **limit,
            )
            return resp.choices[0].message.content
        except Exception as e:  # the rules still answer
            print(f"triage: LLM call failed ({type(e).__name__}); using rules", file=sys.stderr)
            return None

    def classify(self, title: str, body: str) -> tuple[str, float] | None:
        return parse_label(self.ask("triage_classify.j2", labels=LABELS, title=title, body=body))

    def extract(self, title: str, body: str) -> dict | None:
        return parse_json_object(self.ask("triage_extract.j2", title=title, body=body))
