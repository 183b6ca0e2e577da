"""How far two labellers agree: `python -m benchmark.triage.real.agreement [SPLIT]` (default test9).

Reads the set's labels (issues.jsonl, the first labeller's) and a second labelling of the same split
(second_labels/SPLIT.jsonl, one line per issue: url, label, confidence, blind), and prints, over the
issues labelled blind (the second labeller had no hint of the first label) and over all of them:
7-way agreement, Cohen's kappa, and the second labeller's silent precision and recall taken against
the first's labels, the same measures the classifier is held to; then the disagreements.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Agreement:
    n: int
    observed: float  # share of issues with the same label
    kappa: float  # Cohen's: observed agreement beyond what the two label distributions give by chance
    silent_precision: float  # of the second labeller's silent, the share the first called silent
    silent_recall: float  # of the first labeller's silent, the share the second called silent


def agreement(pairs: list[tuple[str, str]]) -> Agreement:
    """(first label, second label) per issue -> the agreement measures."""
    n = len(pairs)
    if not n:
        raise ValueError("no issue to compare")
    observed = sum(a == b for a, b in pairs) / n
    first, second = Counter(a for a, _ in pairs), Counter(b for _, b in pairs)
    chance = sum(first[k] * second[k] for k in first) / (n * n)
    kappa = 1.0 if chance == 1 else (observed - chance) / (1 - chance)
    both = sum(a == b == "silent" for a, b in pairs)
    precision = both / second["silent"] if second["silent"] else float("nan")
    recall = both / first["silent"] if first["silent"] else float("nan")
    return Agreement(n, observed, kappa, precision, recall)


def load_pairs(split: str, root: Path = HERE) -> list[dict]:
    """The second labels of `split`, each with the first label beside it (`first`)."""
    first = {}
    for line in (root / "issues.jsonl").read_text().splitlines():
        row = json.loads(line)
        first[row["url"]] = (row["label"], row["split"])
    rows = [json.loads(line) for line in (root / "second_labels" / f"{split}.jsonl").read_text().splitlines()]
    for row in rows:
        label, in_split = first[row["url"]]
        if in_split != split:
            raise ValueError(f"{row['url']} is in {in_split}, not {split}")
        row["first"] = label
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.triage.real.agreement", description=__doc__.split("\n")[0])
    ap.add_argument("split", nargs="?", default="test9")
    args = ap.parse_args(argv)
    rows = load_pairs(args.split)
    for name, chosen in (("blind", [r for r in rows if r.get("blind", True)]), ("all", rows)):
        a = agreement([(r["first"], r["label"]) for r in chosen])
        print(
            f"{args.split} {name:<5} n={a.n:<4} agreement {a.observed:.3f}  kappa {a.kappa:.3f}  "
            f"second labeller's silent P {a.silent_precision:.3f} R {a.silent_recall:.3f}"
        )
    for r in rows:
        if r["first"] != r["label"]:
            blind = "blind" if r.get("blind", True) else "named in the guide"
            print(f"  {r['url']}: first {r['first']}, second {r['label']} ({r['confidence']}, {blind}): {r['why']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
