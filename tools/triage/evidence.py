"""The shape of an issue, as features for the triage model. Pure functions, no label names in them.

The rules (`tools.triage.rules`) look for what a reporter says; these features record how the report
is built, which generalises across trackers and wordings better than more keyword cues:
  - what it shows: code blocks, a traceback or a named exception, a shown output or prompt,
    "expected ... but got" evidence, a comparison with something else;
  - how it is framed: a title that asks (ends in "?" or opens with an interrogative), questions in the
    prose, the issue template's title tag (`[Bug]`, `[Usage]`, ...), and nothing but a tag;
  - its size and script: no body, body length, mostly CJK text.
So a wrong output asked as a question ("X supported?" over two differing outputs) and a bare `[Bug]`
title over a traceback are told apart by what the body carries, not by new phrasings.
"""

from __future__ import annotations

import math
import re

from tools.triage import rules as triage_rules


def _rx(p: str) -> re.Pattern:
    return re.compile(p, re.I | re.M)


_ASKING_TITLE = _rx(r"\?\s*$|？\s*$|吗\s*$")
_INTERROGATIVE = _rx(
    r"^\s*(how|is|are|can|could|does|do|did|what|why|which|when|where|should|would|will|has|have|any)\b"
)
_EXPECTED = _rx(
    r"\bexpected (output|result|behaviou?r|answer|response)|\bexpect(ed|ing)? (it |the (model|output) )?to\b"
    r"|\bshould (be|return|output|give|produce|print|say)\b|\bcorrect (answer|output|result|response) (is|would be|should be)"
)
_ACTUAL = _rx(
    r"\bactual (output|result|behaviou?r|answer|response)|\binstead of\b|\bbut got\b"
    r"|\b(but|instead) (it |the model |we )?(got|gets|returns?|outputs?|gives?|produces?|generates?|prints?|says)\b"
)
_OUTPUT_SHOWN = _rx(
    r"^\s*(\*\*)?(output|response|answer|result|generated( text)?|completion|model output|generation)s?(\*\*)?\s*[:：]"
)
_PROMPT_SHOWN = _rx(r"^\s*(\*\*)?(prompt|input|question|query|messages?)(\*\*)?\s*[:：]|\bprompt\s*=|messages\s*=")
_COMPARES = _rx(r"\b(compared? (to|with)|vs\.?|versus|while|whereas)\b")
# The template tags of triage_rules.TITLE_TAGS, aliases folded; one indicator each.
TAGS = (
    "bug",
    "build",
    "ci",
    "doc",
    "feature",
    "installation",
    "misc",
    "new model",
    "performance",
    "question",
    "rfc",
    "usage",
)
_TAG_ALIAS = {"feature request": "feature", "docs": "doc"}
NAMES = (
    "has code",
    "traceback",
    "exception named",
    "title asks",
    "title opens with an interrogative",
    "questions in prose",
    "no body",
    "body length",
    "tag only",
    "mostly CJK",
    "expected shown",
    "actual shown",
    "expected and actual",
    "output shown",
    "prompt shown",
    "comparison",
    *(f"tag {t}" for t in TAGS),
)


def title_tag(title: str) -> str:
    """The issue template's tag of the title, lower case ('' when none)."""
    m = triage_rules._TITLE_TAG.match(title)
    name = (m.group(1) or m.group(2)).strip().lower() if m else ""
    return _TAG_ALIAS.get(name, name)


def shape(title: str, body: str) -> list[float]:
    """NAMES-ordered features of an issue, each in [0, ~1.5]. Pure."""
    t = triage_rules.split_issue(title, body)
    text = f"{t.title}\n{t.prose}"
    shown = f"{t.prose}\n{t.code}"
    exceptions = [n for n in triage_rules._EXCEPTION.findall(shown) if n.lower() not in ("error", "exception")]
    bare = triage_rules._TITLE_TAG.sub("", t.title).strip()
    cjk = sum("\u4e00" <= ch <= "\u9fff" for ch in text) / max(1, len(text))
    expected, actual = bool(_EXPECTED.search(text)), bool(_ACTUAL.search(text))
    tag = title_tag(t.title)
    flags = [
        bool(t.code.strip()),
        bool(triage_rules._TRACEBACK.search(t.code)),
        bool(exceptions),
        bool(_ASKING_TITLE.search(t.title)),
        bool(_INTERROGATIVE.search(bare)),
    ]
    return [
        *map(float, flags),
        min(t.prose.count("?") + t.prose.count("？"), 5) / 5,
        float(not (body or "").strip()),
        min(math.log1p(len(body or "")) / 8, 1.5),  # ~0.7 for 250 characters, 1.0 for 3000
        float(len(bare) < 4),
        float(cjk > 0.05),
        float(expected),
        float(actual),
        float(expected and actual),
        float(bool(_OUTPUT_SHOWN.search(shown))),
        float(bool(_PROMPT_SHOWN.search(shown))),
        float(bool(_COMPARES.search(text))),
        *(float(tag == name) for name in TAGS),
    ]
