"""The labelling guide of the real triage set names no issue of the set, so that a second labeller who reads it is
blind on every issue: no issue number, no GitHub address, no quoted title and no run of six words shared with a
title or body in issues.jsonl. The per-collection logs that do name issues live in COLLECTIONS.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

REAL = Path(__file__).resolve().parents[2] / "benchmark" / "triage" / "real"
RUN = 6

_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _runs(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _guide() -> str:
    return (REAL / "LABELING.md").read_text(encoding="utf-8")


def _issues() -> list[dict[str, str]]:
    lines = (REAL / "issues.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_the_guide_has_no_issue_number_or_address():
    guide = _guide()
    assert not re.findall(r"#\d+", guide)
    assert "github.com" not in guide.lower()
    assert "COLLECTIONS.md" in guide  # it points to the logs without quoting them


def test_the_guide_shares_no_six_word_run_with_an_issue():
    guide_runs = _runs(_words(_guide()), RUN)
    shared = set()
    for issue in _issues():
        for field in ("title", "body"):
            words = _words(issue[field])
            shared |= {" ".join(r) for r in _runs(words, RUN) & guide_runs}
    assert not shared, sorted(shared)


def test_the_guide_quotes_no_title_of_the_set():
    guide = _guide()
    titles = {" ".join(_words(issue["title"])) for issue in _issues()} - {""}
    # invented phrasings are in double quotes; a bare template tag ("[Bug]") names no issue
    quoted = {q for q in re.findall(r'"([^"\n]+)"', guide) if not re.fullmatch(r"\W*\[[^\]]*\]\W*", q)}
    hits = {q for q in quoted if " ".join(_words(q)) in titles}
    assert not hits, sorted(hits)
    # a short title (fewer than six words, so the run check misses it) met word for word in the running text
    text = " " + " ".join(_words(guide)) + " "
    short = {t for t in titles if 3 <= len(t.split()) < RUN and f" {t} " in text}
    assert not short, sorted(short)


def test_the_collection_logs_moved_whole():
    logs = (REAL / "COLLECTIONS.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (\w+) collection", logs, flags=re.M)
    moved = ["Second", "Third", "Fourth", "Fifth", "Sixth", "Seventh", "Eighth", "Ninth", "Tenth"]
    assert headings[: len(moved)] == moved  # later collections append their own log here
    assert not re.search(r"^## \w+ collection", _guide(), flags=re.M)
    assert "## Provenance and text" in _guide() and "## Provenance and text" not in logs
