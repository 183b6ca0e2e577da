"""Issue triage: the explainable rules combined with a linear model over word and character n-grams.

The model is a multinomial logistic regression whose features are
  - TF-IDF of word 1-2-grams and of character 2-5-grams (within word boundaries) of the issue's
    title (counted twice: it says more) and prose, plus the first code block lines, and
  - the seven rule scores of `tools.triage.rules` (scaled), so the model learns how far to trust
    each rule family instead of replacing it.
It is fitted on the train split of the real labelled set (`benchmark/triage/real/`), its
regularisation chosen on dev (so dev and test stay out of sample), its softmax temperature
chosen by 5-fold cross-validation on train (so the confidence is calibrated without touching dev), and shipped as plain JSON weights (`tools/triage/model.json`, no
pickle). `python -m tools.triage.model fit` regenerates that file byte for byte.

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

from tools.triage import rules as triage_rules
from tools.triage.rules import LABELS, Classification

WEIGHTS = Path(__file__).with_name("model.json")
REAL_SET = Path(__file__).resolve().parents[2] / "benchmark" / "triage" / "real" / "issues.jsonl"
CODE_CHARS = 1500  # the first lines of code blocks: the exception, the command; the rest is noise
RULE_SCALE = 0.2  # rule scores run 0..~15; the tf-idf features are l2-normalised
WORD = {
    "analyzer": "word",
    "ngram_range": (1, 2),
    "token_pattern": r"(?u)\b\w[\w.\-]*\w\b|\b\w\b",
    "min_df": 2,
    "max_features": 6000,
}
CHAR = {"analyzer": "char_wb", "ngram_range": (2, 5), "min_df": 2, "max_features": 12000}
C_GRID = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
T_GRID = tuple(round(0.3 + 0.1 * k, 1) for k in range(28))  # 0.3 .. 3.0
SILENT_MIN = 0.4  # out-of-fold (5-fold CV, train + dev): silent P 0.90 -> 0.94, R 0.95 -> 0.95; dev R 0.96 -> 0.88
DIGITS = 5  # rounding of stored weights: regeneration is byte-identical across BLAS orders


def model_text(title: str, body: str) -> str:
    """Title twice, prose, the first code lines (templates and env dumps already dropped)."""
    t = triage_rules.split_issue(title, body)
    return f"{t.title}\n{t.title}\n{t.prose}\n{t.code[:CODE_CHARS]}"


def rule_vector(title: str, body: str) -> tuple[list[float], Classification]:
    """The rules' final scores (LABELS order), scaled, and the rules' own classification."""
    c = triage_rules.classify(title, body)
    return [c.scores.get(lab, 0.0) * RULE_SCALE for lab in LABELS], c


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
    rules, c = rule_vector(title, body)
    offset = n_word + len(w["char"]["idf"])
    x.update({offset + k: v for k, v in enumerate(rules) if v})
    return x, rules, c


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
    k = decide(p, w.get("silent_min", 0.0))
    return Classification(
        LABELS[k], round(float(p[k]), 3), rules_c.scores, rules_c.cues + tuple(top_terms(w, idx, val, k))
    )


def decide(p: np.ndarray, silent_min: float) -> int:
    """The most probable label, except that `silent` needs `silent_min` (else the runner-up). Pure.

    A false silent alarm costs a diagnosis run and a wrong comment; below SILENT_MIN the
    out-of-fold silent answers were mostly wrong (README, "The classifier")."""
    order = np.argsort(-p, kind="stable")
    k = int(order[0])
    return int(order[1]) if LABELS[k] == "silent" and p[k] < silent_min else k


def top_terms(w: dict, idx: np.ndarray, val: np.ndarray, k: int, n: int = 3) -> list[str]:
    """The n-grams that pushed the winning label hardest: `label:ngram 'text'`."""
    names = w.get("_names") or _names(w)
    contrib = w["_coef"][k, idx] * val
    best = [i for i in np.argsort(-contrib)[:n] if contrib[i] > 0 and idx[i] < len(names)]
    return [f"{LABELS[k]}:ngram {names[idx[i]]!r}" for i in best]


def _names(w: dict) -> list[str]:
    names = [""] * (len(w["word"]["idf"]) + len(w["char"]["idf"]))
    for term, j in w["word"]["vocab"].items():
        names[j] = term
    for term, j in w["char"]["vocab"].items():
        names[len(w["word"]["idf"]) + j] = term
    w["_names"] = names
    return names


# --- fitting (build time) ----------------------------------------------------------------------


def fit(issues: list[dict], c_value: float) -> dict:
    """Fit vocabularies, idf and the logistic regression on `issues`. Deterministic."""
    from scipy.sparse import csr_matrix, hstack
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    texts = [model_text(i["title"], i["body"]) for i in issues]
    blocks, parts = {}, []
    for name, spec in (("word", WORD), ("char", CHAR)):
        vec = TfidfVectorizer(lowercase=True, sublinear_tf=True, **spec)
        parts.append(vec.fit_transform(texts))
        vocab = {t: int(j) for t, j in sorted(vec.vocabulary_.items(), key=lambda kv: kv[1])}
        blocks[name] = {
            "spec": {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.items()},
            "vocab": vocab,
            "idf": [round(float(v), DIGITS) for v in vec.idf_],
        }
    parts.append(csr_matrix([rule_vector(i["title"], i["body"])[0] for i in issues]))
    x = hstack(parts).tocsr()
    y = [LABELS.index(i["label"]) for i in issues]
    lr = LogisticRegression(C=c_value, max_iter=5000, class_weight="balanced", tol=1e-8)
    lr.fit(x, y)
    coef = np.zeros((len(LABELS), x.shape[1]))
    coef[lr.classes_] = lr.coef_
    intercept = np.zeros(len(LABELS)) - 30.0  # a label absent from training never wins
    intercept[lr.classes_] = lr.intercept_
    return {
        "labels": list(LABELS),
        "C": c_value,
        "rule_scale": RULE_SCALE,
        "n_train": len(issues),
        "word": blocks["word"],
        "char": blocks["char"],
        "coef": [[round(float(v), DIGITS) for v in row] for row in coef],
        "intercept": [round(float(v), DIGITS) for v in intercept],
    }


def _ready(weights: dict) -> dict:
    w = dict(weights)
    w["_word"], w["_char"] = _analyzer(w["word"]["spec"]), _analyzer(w["char"]["spec"])
    w["_coef"] = np.array(w["coef"])
    return w


def accuracy(weights: dict, issues: list[dict]) -> float:
    w = _ready(weights)
    return sum(classify(i["title"], i["body"], w).label == i["label"] for i in issues) / len(issues)


def logits_of(weights: dict, issue: dict) -> np.ndarray:
    w = _ready(weights)
    x, _, _ = features(issue["title"], issue["body"], w)
    idx, val = np.array(list(x.keys()), dtype=np.int64), np.array(list(x.values()))
    return w["_coef"][:, idx] @ val + np.array(w["intercept"])


def choose_temperature(train: list[dict], c_value: float, folds: int = 5) -> float:
    """Softmax temperature minimising the out-of-fold log loss on train (k-fold by position)."""
    rows = []  # (logits, gold index)
    for k in range(folds):
        held = [i for n, i in enumerate(train) if n % folds == k]
        weights = fit([i for n, i in enumerate(train) if n % folds != k], c_value)
        rows += [(logits_of(weights, i), LABELS.index(i["label"])) for i in held]

    def nll(t: float) -> float:
        return -sum(math.log(softmax(z / t)[y] + 1e-12) for z, y in rows) / len(rows)

    return min(T_GRID, key=nll)


def choose_c(train: list[dict], dev: list[dict]) -> tuple[float, dict[float, float]]:
    """The regularisation with the best dev accuracy (ties: the stronger regularisation)."""
    scores = {c: round(accuracy(fit(train, c), dev), 4) for c in C_GRID}
    return max(C_GRID, key=lambda c: (scores[c], -c)), scores


def build(path: Path = REAL_SET) -> tuple[dict, dict]:
    """Tune C on dev, fitting on train; ship the train fit (dev and test stay out of sample)."""
    issues = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    train = [i for i in issues if i["split"] == "train"]
    dev = [i for i in issues if i["split"] == "dev"]
    c_value, scores = choose_c(train, dev)
    weights = fit(train, c_value)
    weights["temperature"] = choose_temperature(train, c_value)
    weights["silent_min"] = SILENT_MIN
    weights["fitted_on"] = "train"
    return weights, {"dev_accuracy_by_C": scores, "C": c_value, "temperature": weights["temperature"]}


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
