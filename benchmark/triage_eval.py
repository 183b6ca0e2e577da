"""Score issue triage on the labelled set: `python -m benchmark.triage_eval`.

Scoring is pure (`score(gold, pred)`); the runner classifies `benchmark/triage/issues.jsonl`
with the rules (or reads predictions produced by `python -m agent.triage classify`, aligned
line for line) and prints per-label precision/recall, the confusion matrix, the silent-class
figures and a calibration check, for the whole set and for the dev and held-out splits.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.triage_rules import LABELS, classify

ISSUES = Path(__file__).parent / "triage" / "issues.jsonl"
# dev: the rules were written with these in view; heldout: scored, never tuned on;
# fresh: written after the rules were frozen (the most honest estimate of generalisation).
SPLITS = ("dev", "heldout", "fresh", "fresh2")


def load_issues(path: Path = ISSUES) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def predict(issues: list[dict]) -> list[dict]:
    return [_as_dict(classify(i.get("title", ""), i.get("body", ""))) for i in issues]


def _as_dict(c) -> dict:
    return {"label": c.label, "confidence": c.confidence}


def score(gold: list[str], pred: list[str], confidence: list[float] | None = None) -> dict:
    """Gold and predicted labels (aligned) -> per-label P/R/F1, confusion, accuracy, ECE."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
    confusion = {g: {p: 0 for p in LABELS} for g in LABELS}
    for g, p in zip(gold, pred):
        confusion[g][p] += 1
    per_label = {lab: _prf(confusion, lab) for lab in LABELS}
    result = {"n": len(gold), "accuracy": _ratio(sum(g == p for g, p in zip(gold, pred)), len(gold)),
              "per_label": per_label, "confusion": confusion,
              "silent": {k: per_label["silent"][k] for k in ("precision", "recall")}}
    if confidence is not None:
        result["ece"] = expected_calibration_error([g == p for g, p in zip(gold, pred)], confidence)
    return result


def _prf(confusion: dict, label: str) -> dict:
    tp = confusion[label][label]
    predicted = sum(row[label] for row in confusion.values())
    actual = sum(confusion[label].values())
    p, r = _ratio(tp, predicted), _ratio(tp, actual)
    f1 = round(2 * p * r / (p + r), 3) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f1, "support": actual}


def _ratio(a: int, b: int) -> float:
    return round(a / b, 3) if b else 0.0


def expected_calibration_error(correct: list[bool], confidence: list[float], bins: int = 5) -> float:
    """Mean |accuracy - confidence| over equal-width confidence bins, weighted by bin size."""
    total, n = 0.0, len(correct)
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        idx = [i for i, c in enumerate(confidence) if lo <= c < hi or (b == bins - 1 and c == 1.0)]
        if idx:
            acc = sum(correct[i] for i in idx) / len(idx)
            conf = sum(confidence[i] for i in idx) / len(idx)
            total += len(idx) / n * abs(acc - conf)
    return round(total, 3)


def evaluate(issues: list[dict], preds: list[dict]) -> dict:
    """Scores for the whole set and each split."""
    out = {}
    for split in ("all", *SPLITS):
        idx = [k for k, i in enumerate(issues) if split == "all" or i.get("split") == split]
        out[split] = score([issues[k]["label"] for k in idx], [preds[k]["label"] for k in idx],
                           [float(preds[k]["confidence"]) for k in idx])
    return out


def format_report(name: str, s: dict) -> str:
    lines = [f"== {name}: n={s['n']} accuracy={s['accuracy']:.3f} ece={s.get('ece', float('nan')):.3f}",
             f"{'label':<12}{'prec':>7}{'recall':>8}{'f1':>7}{'n':>5}"]
    for lab, m in s["per_label"].items():
        lines.append(f"{lab:<12}{m['precision']:>7.3f}{m['recall']:>8.3f}{m['f1']:>7.3f}{m['support']:>5}")
    lines.append("confusion (rows gold, columns predicted):")
    lines.append(" " * 12 + "".join(f"{lab[:6]:>7}" for lab in LABELS))
    for g in LABELS:
        lines.append(f"{g:<12}" + "".join(f"{s['confusion'][g][p]:>7}" for p in LABELS))
    lines.append(f"silent precision={s['silent']['precision']:.3f} recall={s['silent']['recall']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--issues", type=Path, default=ISSUES, help="labelled jsonl (label, split keys)")
    ap.add_argument("--predictions", type=Path, help="output of `agent.triage classify` (default: run the rules)")
    ap.add_argument("--errors", action="store_true", help="also list misclassified issues")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    issues = load_issues(args.issues)
    preds = load_issues(args.predictions) if args.predictions else predict(issues)
    figures = evaluate(issues, preds)
    for split in ("all", *SPLITS):
        print(format_report(split, figures[split]), end="\n\n")
    if args.errors:
        for i, p in zip(issues, preds):
            if i["label"] != p["label"]:
                print(f"{i.get('id')} [{i.get('split')}] gold={i['label']} pred={p['label']} ({p['confidence']}): {i['title']}")
    if args.out:
        args.out.write_text(json.dumps({"issues": str(args.issues), "figures": figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
