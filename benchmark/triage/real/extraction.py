"""How often a runnable scenario can be read out of real silent-error issues, and what is missing.

    python -m benchmark.triage.real.extraction [--split test] [--json]

For each gold-`silent` issue of the split, `tools.triage.extract.extract_scenario` reads the text.
Reported: the share with a runnable scenario (`to_scenario` accepts it: a model and a prompt), the
share with each part (model path or arch, engine, engine version, dtype, engine options, prompts,
sampling, max_tokens, a named reference), and how often each piece is missing. The stored bodies
are excerpts (see README), so the figures are also given for issues whose body starts at the top.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from tools.triage.extract import extract_scenario, to_scenario

ISSUES = Path(__file__).with_name("issues.jsonl")
PARTS = ("model", "engine", "engine_version", "dtype", "options", "prompts", "sampling", "max_tokens", "good_ref")


def parts_found(partial: dict) -> dict[str, bool]:
    """Which scenario parts an extraction holds. Pure."""
    requests = partial.get("workload", {}).get("requests", [])
    meta, target = partial.get("meta", {}), partial.get("target", {})
    return {
        "model": bool(partial.get("model")),
        "engine": bool(meta.get("engine") or target.get("engine")),
        "engine_version": bool(meta.get("engine_version")),
        "dtype": bool(target.get("dtype")),
        "options": bool(target.get("options")),
        "prompts": bool(requests),
        "sampling": any(r.get("sampling") for r in requests),
        "max_tokens": any("max_tokens" in r for r in requests),
        "good_ref": bool(partial.get("good_ref") or meta.get("reference")),  # a known-good version or a reference
    }


def extraction_row(issue: dict) -> dict:
    partial, missing = extract_scenario(issue["title"], issue["body"])
    return {
        "url": issue["url"],
        "body_part": issue.get("body_part"),
        "runnable": to_scenario(partial) is not None,
        "found": parts_found(partial),
        "missing": missing,
    }


def summarize(rows: list[dict]) -> dict:
    """Rows -> shares (runnable, each part) and counts of each missing piece. Pure."""
    n = len(rows)
    share = lambda k: round(sum(r["found"][k] for r in rows) / n, 3) if n else 0.0
    return {
        "n": n,
        "runnable": round(sum(r["runnable"] for r in rows) / n, 3) if n else 0.0,
        "parts": {k: share(k) for k in PARTS},
        "missing": dict(Counter(m for r in rows for m in r["missing"]).most_common()),
    }


def report(issues: list[dict], split: str) -> dict:
    rows = [extraction_row(i) for i in issues if i["label"] == "silent" and i["split"] == split]
    return {
        "split": split,
        "all": summarize(rows),
        "body_from_start": summarize([r for r in rows if r["body_part"] == "start"]),
        "rows": rows,
    }


def format_summary(name: str, s: dict) -> str:
    lines = [f"{name}: n={s['n']} runnable scenario {s['runnable']:.0%}"]
    lines.append("  has: " + ", ".join(f"{k} {v:.0%}" for k, v in s["parts"].items()))
    lines.append("  missing: " + ", ".join(f"{k} {v}" for k, v in s["missing"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="test")
    ap.add_argument("--json", action="store_true", help="print the full report as JSON")
    args = ap.parse_args(argv)
    issues = [json.loads(line) for line in ISSUES.read_text().splitlines() if line.strip()]
    rep = report(issues, args.split)
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print(format_summary(f"silent issues of {args.split}", rep["all"]))
        print(format_summary("  of which the body starts at the top", rep["body_from_start"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
