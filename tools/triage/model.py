"""Issue triage: the explainable rules combined with a linear model over word and character n-grams.

The model is a multinomial logistic regression whose features are
  - TF-IDF of word 1-2-grams and of character 2-5-grams (within word boundaries) of the issue's
    title (counted twice: it says more) and prose, plus the first code block lines, and
  - the seven rule scores of `tools.triage.rules` (scaled), so the model learns how far to trust
    each rule family instead of replacing it, and
  - the shape of the report (`tools.triage.evidence`: traceback, shown output, expected-vs-actual,
    a title that asks, the template tag, ...), which carries across trackers better than phrasings.
It is fitted on every split of the real labelled set (`benchmark/triage/real/`) that has been
looked at: train, dev, test and test2 to test8 (FIT_SPLITS; a split added later, test9 on, is not read).
Every setting (C, silent class weight, softmax temperature, silent-vs-rest threshold) is chosen by
leave-one-split-out on those issues, judged on the collections each gathered by a fresh labeller
(RECENT_SPLITS: the best min(silent precision, silent recall) there, as the targets ask for both); k-fold
overstated every first sight by 0.04-0.16 in recall. The out-of-split figures are stored with the weights, also per split. Shipped
as plain JSON weights (`tools/triage/model.json`, no pickle); `python -m tools.triage.model fit`
regenerates that file byte for byte.

`classify(title, body)` returns the same `Classification` as the rules: label, the model's
probability as confidence (its calibration is in `python -m benchmark.triage_eval`), the rule
scores, and the cues that explain it (rule cues, then the n-grams that pushed hardest).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from tools.triage import evidence as triage_evidence
from tools.triage import rules as triage_rules
from tools.triage.rules import LABELS, Classification

WEIGHTS = Path(__file__).with_name("model.json")
REAL_SET = Path(__file__).resolve().parents[2] / "benchmark" / "triage" / "real" / "issues.jsonl"
CODE_CHARS = 1500  # the first lines of code blocks: the exception, the command; the rest is noise
RULE_SCALE = 0.2  # rule scores run 0..~15; the tf-idf features are l2-normalised (default; `fit` takes another)
WORD = {
    "analyzer": "word",
    "ngram_range": (1, 2),
    "token_pattern": r"(?u)\b\w[\w.\-]*\w\b|\b\w\b",
    "min_df": 2,
    "max_features": 6000,
}
CHAR = {"analyzer": "char_wb", "ngram_range": (2, 5), "min_df": 2, "max_features": 12000}
# The shape features are mostly 0/1; next to l2-normalised n-grams 0.3 was best out of fold (0.5, 1.0 worse).
EVIDENCE_SCALE = 0.3
# The install-vs-crash shapes (`tools.triage.evidence.ENVIRONMENT_NAMES`) count this many times the others: rare
# (a few dozen issues each) but nearly one-sided, and at 1x a fit learned too little from them to move a launch
# failure off `crash` (1x, 3x, 6x by leave-one-split-out: README eighth round).
ENVIRONMENT_WEIGHT = 6.0
# C 1, 2, 8, 16 and silent weights 1.5, 2 were run too (README, seventh round): once each setting has its own
# threshold they land within one issue of C = 4, weight 1 on the recent collections; widen the grids to re-run them.
C_GRID = (4.0,)
RULE_SCALE_GRID = (0.05,)  # how loud the rule scores are next to the n-grams (0.02, 0.1, 0.2: README, seventh round)
# `silent` counts this many times its balanced class weight: a missed silent error costs more than a false alarm,
# and every first sight so far lost silent recall, not precision.
SILENT_WEIGHT_GRID = (1.0,)
T_GRID = tuple(round(0.3 + 0.1 * k, 1) for k in range(28))  # 0.3 .. 3.0
SILENT_MIN_GRID = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6)  # `silent` exactly when p(silent) >= this
# The seen splits; a later one (test9, ...) is never read.
FIT_SPLITS = ("train", "dev", "test", "test2", "test3", "test4", "test5", "test6", "test7", "test8")
# The collections each gathered by a fresh labeller, as the next one will be: every setting is judged on them,
# each scored by a fit on all the other splits (every earlier first sight fell below its k-fold recall).
RECENT_SPLITS = ("test3", "test4", "test5", "test6", "test7", "test8")
OOF_TOL = 1e-6  # solver tolerance of the out-of-split fits (the grid); the shipped fit uses FIT_TOL
FIT_TOL = 1e-8
FOLDS = 5
DIGITS = 5  # rounding of stored weights: regeneration is byte-identical across BLAS orders


def model_text(title: str, body: str) -> str:
    """Title twice, prose, the first code lines (templates and env dumps already dropped)."""
    t = triage_rules.split_issue(title, body)
    return f"{t.title}\n{t.title}\n{t.prose}\n{t.code[:CODE_CHARS]}"


def rule_vector(title: str, body: str, scale: float = RULE_SCALE) -> tuple[list[float], Classification]:
    """The rules' final scores (LABELS order), scaled, and the rules' own classification."""
    c = triage_rules.classify(title, body)
    return [c.scores.get(lab, 0.0) * scale for lab in LABELS], c


# --- feature extraction (pure given the stored vocabularies) -------------------------------


def _analyzer(spec: dict):
    from sklearn.feature_extraction.text import TfidfVectorizer

    kw = {k: v for k, v in spec.items() if k in ("analyzer", "ngram_range", "token_pattern")}
    return TfidfVectorizer(lowercase=True, **kw).build_analyzer()


def tfidf(terms: list[str], vocab: dict[str, int], idf: list[float]) -> dict[int, float]:
    """Sublinear tf * idf over the known terms, l2-normalised (as sklearn's TfidfVectorizer). Sparse."""
    counts: dict[int, int] = {}
    for term in terms:
        j = vocab.get(term)
        if j is not None:
            counts[j] = counts.get(j, 0) + 1
    vec = {j: (1.0 + math.log(n)) * idf[j] for j, n in counts.items()}
    norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
    return {j: v / norm for j, v in vec.items()}


@lru_cache(maxsize=1)
def load_weights(path: Path = WEIGHTS) -> dict:
    w = json.loads(path.read_text())
    w["_word"], w["_char"] = _analyzer(w["word"]["spec"]), _analyzer(w["char"]["spec"])
    w["_coef"] = np.array(w["coef"], dtype=np.float64)  # [labels, features]
    return w


def features(title: str, body: str, w: dict) -> tuple[dict[int, float], list[float], Classification]:
    """Sparse feature vector (word block, char block, rule block) and the rules' classification."""
    text = model_text(title, body)
    n_word = len(w["word"]["idf"])
    x = tfidf(w["_word"](text), w["word"]["vocab"], w["word"]["idf"])
    x.update({n_word + j: v for j, v in tfidf(w["_char"](text), w["char"]["vocab"], w["char"]["idf"]).items()})
    rules, c = rule_vector(title, body, w.get("rule_scale", RULE_SCALE))
    offset = n_word + len(w["char"]["idf"])
    x.update({offset + k: v for k, v in enumerate(rules) if v})
    if "evidence_scale" in w:  # weights fitted before the shape block have no columns for it
        width = len(w["coef"][0]) - offset - len(rules)  # weights fitted before a shape feature was added lack it
        shape = evidence_vector(title, body, w["evidence_scale"])[:width]
        x.update({offset + len(rules) + k: v for k, v in enumerate(shape) if v})
    return x, rules, c


def evidence_vector(title: str, body: str, scale: float = EVIDENCE_SCALE) -> list[float]:
    """The report's shape (`tools.triage.evidence.NAMES` order), scaled; the install-vs-crash shapes
    ENVIRONMENT_WEIGHT times more."""
    env = set(triage_evidence.ENVIRONMENT_NAMES)
    return [
        v * scale * (ENVIRONMENT_WEIGHT if name in env else 1.0)
        for name, v in zip(triage_evidence.NAMES, triage_evidence.shape(title, body))
    ]


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


# --- classification --------------------------------------------------------------------------


def classify(title: str, body: str, weights: dict | None = None) -> Classification:
    """Rules + linear model -> label, calibrated confidence, rule scores, explaining cues."""
    w = weights or load_weights()
    x, _, rules_c = features(title, body, w)
    idx = np.fromiter(x.keys(), dtype=np.int64, count=len(x))
    val = np.fromiter(x.values(), dtype=np.float64, count=len(x))
    logits = w["_coef"][:, idx] @ val + np.array(w["intercept"])
    p = softmax(logits / w.get("temperature", 1.0))
    k = decide(p, w.get("silent_min"))
    return Classification(
        LABELS[k], round(float(p[k]), 3), rules_c.scores, rules_c.cues + tuple(top_terms(w, idx, val, k))
    )


def silent_threshold(weights: dict | None = None) -> float:
    """The p(silent) at or above which `classify` answers `silent` (`silent_min`, chosen with the weights). The one
    silent setting: `agent.triage` labels and comments on a silent answer at this same confidence."""
    w = weights or load_weights()
    return float(w["silent_min"]) if w.get("silent_min") is not None else 0.5


def decide(p: np.ndarray, silent_min: float | None) -> int:
    """Silent-vs-rest first: `silent` exactly when p(silent) >= `silent_min`; else the most probable
    other label (`silent_min` None: the most probable label). Pure.

    A false silent alarm costs a diagnosis run and a wrong comment, a miss leaves a wrong answer
    unexamined; the threshold is the one with the best out-of-split min(silent precision, recall)
    (`choose_decision`)."""
    s = LABELS.index("silent")
    if silent_min is None:
        return int(np.argmax(p))
    if p[s] >= silent_min:
        return s
    rest = np.array(p, dtype=np.float64)
    rest[s] = -1.0
    return int(np.argmax(rest))


def top_terms(w: dict, idx: np.ndarray, val: np.ndarray, k: int, n: int = 3) -> list[str]:
    """The features that pushed the winning label hardest: `label:ngram 'text'`, `label:rule score 'label'` or
    `label:shape 'name'` (a report-shape feature of `tools.triage.evidence`)."""
    names = w.get("_names") or _names(w)
    contrib = w["_coef"][k, idx] * val
    best = [i for i in np.argsort(-contrib)[:n] if contrib[i] > 0 and idx[i] < len(names)]
    return [f"{LABELS[k]}:{names[idx[i]]}" for i in best]


def _names(w: dict) -> list[str]:
    n_word, n_char = len(w["word"]["idf"]), len(w["char"]["idf"])
    names = [""] * (n_word + n_char)
    for term, j in w["word"]["vocab"].items():
        names[j] = f"ngram {term!r}"
    for term, j in w["char"]["vocab"].items():
        names[n_word + j] = f"ngram {term!r}"
    names += [f"rule score {lab!r}" for lab in LABELS]
    names += [f"shape {name!r}" for name in triage_evidence.NAMES][: len(w["coef"][0]) - len(names)]
    w["_names"] = names
    return names


# --- fitting (build time) ----------------------------------------------------------------------


def fit(
    issues: list[dict],
    c_value: float,
    rule_scale: float = RULE_SCALE,
    evidence_scale: float = EVIDENCE_SCALE,
    silent_weight: float = 1.0,
    tol: float = FIT_TOL,
) -> dict:
    """Fit vocabularies, idf and the logistic regression on `issues`. Deterministic."""
    blocks, vectorizers = fit_text(issues)
    texts = [model_text(i["title"], i["body"]) for i in issues]
    rules, shape = side_features(issues)
    x = design([v.transform(texts) for v in vectorizers], rules, shape, rule_scale, evidence_scale)
    coef, intercept = fit_linear(x, [LABELS.index(i["label"]) for i in issues], c_value, silent_weight, tol)
    return {
        "labels": list(LABELS),
        "C": c_value,
        "rule_scale": rule_scale,
        "evidence_scale": evidence_scale,
        "silent_weight": silent_weight,
        "n_train": len(issues),
        "word": blocks["word"],
        "char": blocks["char"],
        "coef": [[round(float(v), DIGITS) for v in row] for row in coef],
        "intercept": [round(float(v), DIGITS) for v in intercept],
    }


def fit_text(issues: list[dict]) -> tuple[dict, list]:
    """The word and char TF-IDF vectorizers fitted on `issues`: their stored form (spec, vocab, idf) and the
    fitted sklearn objects (word, char)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = [model_text(i["title"], i["body"]) for i in issues]
    blocks, vectorizers = {}, []
    for name, spec in (("word", WORD), ("char", CHAR)):
        vec = TfidfVectorizer(lowercase=True, sublinear_tf=True, **spec).fit(texts)
        vectorizers.append(vec)
        vocab = {t: int(j) for t, j in sorted(vec.vocabulary_.items(), key=lambda kv: kv[1])}
        blocks[name] = {
            "spec": {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.items()},
            "vocab": vocab,
            "idf": [round(float(v), DIGITS) for v in vec.idf_],
        }
    return blocks, vectorizers


def side_features(issues: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Unscaled rule scores [n, labels] and report shape [n, NAMES] of `issues`."""
    rules = np.array([rule_vector(i["title"], i["body"], 1.0)[0] for i in issues], dtype=np.float64)
    shape = np.array([evidence_vector(i["title"], i["body"], 1.0) for i in issues], dtype=np.float64)
    return rules, shape


def design(text_blocks: list, rules: np.ndarray, shape: np.ndarray, rule_scale: float, evidence_scale: float):
    """The feature matrix [n, words + chars + labels + NAMES] (csr): text blocks, scaled rule scores, scaled shape."""
    from scipy.sparse import csr_matrix, hstack

    return hstack([*text_blocks, csr_matrix(rules * rule_scale), csr_matrix(shape * evidence_scale)]).tocsr()


def fit_linear(x, y: list[int], c_value: float, silent_weight: float, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression, balanced class weights with `silent` counted `silent_weight` times ->
    (coef [labels, features], intercept [labels]); a label absent from `y` gets intercept -30 (never wins)."""
    from sklearn.linear_model import LogisticRegression

    counts = np.bincount(y, minlength=len(LABELS))
    weight = {k: len(y) / (len(set(y)) * n) for k, n in enumerate(counts) if n}
    silent = LABELS.index("silent")
    if silent in weight:
        weight[silent] *= silent_weight
    lr = LogisticRegression(C=c_value, max_iter=5000, class_weight=weight, tol=tol)
    lr.fit(x, y)
    coef = np.zeros((len(LABELS), x.shape[1]))
    intercept = np.zeros(len(LABELS)) - 30.0
    if len(lr.classes_) == 2:  # sklearn keeps one row for two classes: the second class against the first
        coef[lr.classes_[1]], intercept[lr.classes_[1]] = lr.coef_[0], lr.intercept_[0]
        intercept[lr.classes_[0]] = 0.0
    else:
        coef[lr.classes_], intercept[lr.classes_] = lr.coef_, lr.intercept_
    return coef, intercept


def _ready(weights: dict) -> dict:
    w = dict(weights)
    w["_word"], w["_char"] = _analyzer(w["word"]["spec"]), _analyzer(w["char"]["spec"])
    w["_coef"] = np.array(w["coef"])
    return w


def logits_of(weights: dict, issue: dict) -> np.ndarray:
    w = weights if "_coef" in weights else _ready(weights)
    x, _, _ = features(issue["title"], issue["body"], w)
    idx, val = np.array(list(x.keys()), dtype=np.int64), np.array(list(x.values()))
    return w["_coef"][:, idx] @ val + np.array(w["intercept"])


def out_of_fold(
    pool: list[dict], c_value: float, rule_scale: float = RULE_SCALE, folds: int = FOLDS, silent_weight: float = 1.0
) -> list[tuple[np.ndarray, int]]:
    """(logits, gold index) of every issue of `pool`, in order, each from a fit on the other folds (k-fold by
    position: issue n is in fold n % folds)."""
    fitted = [
        _ready(fit([i for n, i in enumerate(pool) if n % folds != k], c_value, rule_scale, silent_weight=silent_weight))
        for k in range(folds)
    ]
    return [(logits_of(fitted[n % folds], i), LABELS.index(i["label"])) for n, i in enumerate(pool)]


def leave_one_split_out(
    pool: list[dict], c_value: float, rule_scale: float = RULE_SCALE, silent_weight: float = 1.0
) -> list[tuple[np.ndarray, int]]:
    """(logits, gold index) of every issue of `pool`, in order, each from a fit on the other splits. Each split is
    its own collection or draw, so this is closer to a first sight than k-fold (on test4 and test6 it gives exactly
    the first-sight figures of the classifiers of 17e137a and 36b2207)."""
    splits = sorted({i["split"] for i in pool})
    fitted = {
        s: _ready(fit([i for i in pool if i["split"] != s], c_value, rule_scale, silent_weight=silent_weight))
        for s in splits
    }
    return [(logits_of(fitted[i["split"]], i), LABELS.index(i["label"])) for i in pool]


Setting = tuple[float, float, float]  # (C, rule scale, silent weight)


def leave_one_split_out_grid(pool: list[dict], grid: list[Setting]) -> dict[Setting, list[tuple[np.ndarray, int]]]:
    """`leave_one_split_out` for every setting of `grid`, sharing each split's vectorizers (they do not depend on
    the setting); fits at OOF_TOL. Deterministic."""
    texts = [model_text(i["title"], i["body"]) for i in pool]
    rules, shape = side_features(pool)
    gold = [LABELS.index(i["label"]) for i in pool]
    logits = {g: np.zeros((len(pool), len(LABELS))) for g in grid}
    for split in sorted({i["split"] for i in pool}):
        held = np.array([i["split"] == split for i in pool])
        _, vectorizers = fit_text([i for i, h in zip(pool, held) if not h])
        blocks = [v.transform(texts) for v in vectorizers]
        for c_value, rule_scale, silent_weight in grid:
            x = design(blocks, rules, shape, rule_scale, EVIDENCE_SCALE)
            y = [g for g, h in zip(gold, held) if not h]
            coef, intercept = fit_linear(x[~held], y, c_value, silent_weight, OOF_TOL)
            logits[c_value, rule_scale, silent_weight][held] = x[held] @ coef.T + intercept
    return {g: [(z, y) for z, y in zip(logits[g], gold)] for g in grid}


def oof_figures(rows: list[tuple[np.ndarray, int]], temperature: float, silent_min: float | None) -> dict:
    """Accuracy, silent precision / recall and log loss of out-of-fold rows under a decision rule. Pure."""
    s = LABELS.index("silent")
    probs = [softmax(z / temperature) for z, _ in rows]
    pred = [decide(p, silent_min) for p in probs]
    gold = [y for _, y in rows]
    tp = sum(p == s and y == s for p, y in zip(pred, gold))
    said, real = sum(p == s for p in pred), sum(y == s for y in gold)
    nll = -sum(math.log(softmax(z / temperature)[y] + 1e-12) for z, y in rows) / len(rows)
    return {
        "accuracy": round(sum(p == y for p, y in zip(pred, gold)) / len(rows), 4),
        "silent_precision": round(tp / said, 4) if said else 0.0,
        "silent_recall": round(tp / real, 4) if real else 0.0,
        "log_loss": round(nll, 4),
        "ece": calibration_error([p == y for p, y in zip(pred, gold)], [float(q[k]) for q, k in zip(probs, pred)]),
    }


def calibration_error(correct: list[bool], confidence: list[float], bins: int = 5) -> float:
    """Expected calibration error: |accuracy - mean confidence| over equal-width bins, weighted by size. Pure."""
    total = 0.0
    for b in range(bins):
        idx = [i for i, c in enumerate(confidence) if b / bins <= c < (b + 1) / bins or (b == bins - 1 and c >= 1.0)]
        if idx:
            acc = sum(correct[i] for i in idx) / len(idx)
            total += len(idx) * abs(acc - sum(confidence[i] for i in idx) / len(idx))
    return round(total / len(correct), 4) if correct else 0.0


def choose_decision(
    rows: list[tuple[np.ndarray, int]], threshold_rows: list[tuple[np.ndarray, int]] | None = None
) -> tuple[float, float]:
    """Temperature (least out-of-fold log loss on `rows`), then the silent threshold on `threshold_rows` (default
    `rows`): the best min(silent precision, silent recall), ties to the better accuracy, then to the higher
    threshold. The targets ask for both at once (P and R >= 0.92); recall bought under a precision floor (the rule
    until the eighth round) picked a threshold whose precision then fell below 0.92 on the next collection."""
    t = min(T_GRID, key=lambda t: oof_figures(rows, t, None)["log_loss"])
    judged = threshold_rows or rows
    figures = {m: oof_figures(judged, t, m) for m in SILENT_MIN_GRID}
    return t, max(SILENT_MIN_GRID, key=lambda m: (balanced(figures[m]), figures[m]["accuracy"], m))


def balanced(f: dict) -> float:
    """min(silent precision, silent recall) of a figures dict: what the targets ask of both. Pure."""
    return min(f["silent_precision"], f["silent_recall"])


def by_split(rows: list[tuple[np.ndarray, int]], pool: list[dict], temperature: float, silent_min: float) -> dict:
    return {
        s: oof_figures([r for r, i in zip(rows, pool) if i["split"] == s], temperature, silent_min) for s in FIT_SPLITS
    }


def build(path: Path = REAL_SET) -> tuple[dict, dict]:
    """Choose every setting by leave-one-split-out on the seen splits (FIT_SPLITS), judged on RECENT_SPLITS: for
    each (C, rule scale, silent weight) the temperature (least log loss over all seen splits) and the silent
    threshold (`choose_decision` on the recent collections); then the setting whose recent figures have the best
    min(silent precision, recall); fit on all seen splits.
    Every held-out split so far scored below its k-fold estimate; a fresh collection scored by a fit on the others
    is the closer stand-in for the next first sight. Splits outside FIT_SPLITS (a held-out split added later) are
    not read."""
    issues = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    pool = [i for i in issues if i["split"] in FIT_SPLITS]
    grid = [(c, r, w) for c in C_GRID for r in RULE_SCALE_GRID for w in SILENT_WEIGHT_GRID]
    rows = leave_one_split_out_grid(pool, grid)
    recent = {g: [r for r, i in zip(rows[g], pool) if i["split"] in RECENT_SPLITS] for g in grid}
    decision = {g: choose_decision(rows[g], recent[g]) for g in grid}
    judged = {g: oof_figures(recent[g], *decision[g]) for g in grid}
    best = max(grid, key=lambda g: setting_key(judged[g], g))
    (c_value, rule_scale, silent_weight), (temperature, silent_min) = best, decision[best]
    weights = fit(pool, c_value, rule_scale, silent_weight=silent_weight)
    weights.update(temperature=temperature, silent_min=silent_min, fitted_on="+".join(FIT_SPLITS))
    weights["cv"] = {"scheme": "leave-one-split-out", **oof_figures(rows[best], temperature, silent_min)}
    weights["cv_by_split"] = by_split(rows[best], pool, temperature, silent_min)
    weights["cv_recent"] = judged[best]
    report = {
        "recent_by_setting": {
            f"C={g[0]} rule_scale={g[1]} silent_weight={g[2]} T={decision[g][0]} silent_min={decision[g][1]}": judged[g]
            for g in grid
        },
        "chosen": {"C": c_value, "rule_scale": rule_scale, "silent_weight": silent_weight},
        "temperature": temperature,
        "silent_min": silent_min,
        "thresholds": threshold_table(rows[best], pool, temperature),
    }
    return weights, {**report, "leave_one_split_out": weights["cv"], "by_split": weights["cv_by_split"]}


def setting_key(f: dict, setting: Setting) -> tuple:
    """Order of settings by their recent leave-one-split-out figures: min(silent precision, recall), accuracy, and
    the quieter, less regularised setting last. Pure."""
    return (balanced(f), f["accuracy"], -setting[2], setting[1], -setting[0])


def threshold_table(rows: list[tuple[np.ndarray, int]], pool: list[dict], temperature: float) -> dict:
    """Leave-one-split-out figures at every grid threshold: the recent collections pooled, and all. Pure."""
    recent = [r for r, i in zip(rows, pool) if i["split"] in RECENT_SPLITS]
    return {
        str(m): {"recent": oof_figures(recent, temperature, m), "all": oof_figures(rows, temperature, m)}
        for m in SILENT_MIN_GRID
    }


def dumps(weights: dict) -> str:
    return json.dumps(weights, ensure_ascii=False, separators=(",", ":"), sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="fit the triage model: python -m tools.triage.model fit")
    ap.add_argument("command", choices=("fit",))
    ap.add_argument("--out", type=Path, default=WEIGHTS)
    args = ap.parse_args(argv)
    weights, report = build()
    args.out.write_text(dumps(weights))
    print(json.dumps(report), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
