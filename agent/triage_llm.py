"""Optional LLM help for triage (DESIGN.md §7): classify an issue, read a scenario out of it.

Any OpenAI-compatible endpoint via the `openai` client (`OPENAI_BASE_URL`, `OPENAI_API_KEY`).
Every answer is checked; an unusable one returns None and the caller keeps the rules' result.
"""
from __future__ import annotations

import json
import os
import sys

from agent.llm import parse_json_object, render
from tools.triage_rules import LABELS

DEFAULT_MODEL = "gpt-4o-mini"
SCENARIO_KEYS = ("model", "target", "workload", "good_ref", "meta")


def parse_label(text: str) -> tuple[str, float] | None:
    obj = parse_json_object(text)
    if not obj or obj.get("label") not in LABELS:
        return None
    try:
        conf = min(1.0, max(0.0, float(obj.get("confidence", 0.5))))
    except (TypeError, ValueError):
        conf = 0.5
    return obj["label"], conf


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
    def __init__(self, model: str | None = None):
        from openai import OpenAI      # only when an LLM is asked for
        if not os.environ.get("OPENAI_BASE_URL"):
            raise RuntimeError("--llm openai needs OPENAI_BASE_URL")
        self.client = OpenAI(api_key=os.environ.get("OPENAI_API_KEY") or "none", max_retries=2)
        self.model = model or os.environ.get("DIFFDX_LLM_MODEL") or DEFAULT_MODEL

    def ask(self, template: str, **ctx) -> str | None:
        try:
            resp = self.client.chat.completions.create(
                model=self.model, temperature=0.0,
                messages=[{"role": "user", "content": render(template, **ctx)}])
            return resp.choices[0].message.content
        except Exception as e:                  # the rules still answer
            print(f"triage: LLM call failed ({type(e).__name__}); using rules", file=sys.stderr)
            return None

    def classify(self, title: str, body: str) -> tuple[str, float] | None:
        return parse_label(self.ask("triage_classify.j2", labels=LABELS, title=title, body=body))

    def extract(self, title: str, body: str) -> dict | None:
        return parse_json_object(self.ask("triage_extract.j2", title=title, body=body))
