"""Triage model transfer to unseen collections and trackers: the tracker-vocabulary mask, the collection
weights, and the nested (honest) leave-one-collection-out estimate."""

import numpy as np
import pytest

from benchmark.triage_eval import REAL, family_of, load_issues
from tools.triage import model as triage_model
from tools.triage.rules import LABELS
from tools.triage.vocab import mask


def test_mask_replaces_tracker_vocabulary_and_keeps_the_sentence():
    text = mask("vLLM 0.6.3 gives garbage with Qwen2.5-7B-Instruct on llama.cpp (fp8 kv cache, Q4_K_M)")
    assert text.split() == [
        "xproject",
        "xversion",
        "gives",
        "garbage",
        "with",
        "xmodel",
        "on",
        "xproject",
        "(",
        "xdtype",
        "kv",
        "cache,",
        "xquant",
        ")",
    ]
    # words that only start like a name are kept; the reference implementation is kept
    assert mask("the option is ignored, unlike transformers") == "the option is ignored, unlike transformers"
    assert mask("TurboMind引擎部署模型").split() == ["xproject", "引擎部署模型"]
    assert mask("see https://x.org/a/b and /home/u/model/run.py") == "see  xurl  and  xpath "


def test_collection_weights_equalise_collections_then_balance_classes():
    groups = ["a", "a", "a", "a", "b", "b"]
    w = triage_model.sample_weights([0, 1, 0, 1, 0, 1], groups, 1.0)  # classes already balanced in each group
    assert w[:4].sum() == pytest.approx(w[4:].sum()) and w[0] == pytest.approx(w[4] / 2)  # a collection per share
    y = [0, 0, 0, 1, 1, 0]
    w = triage_model.sample_weights(y, groups, 1.0)
    by_class = [w[np.array(y) == k].sum() for k in (0, 1)]
    assert by_class[0] == pytest.approx(by_class[1])  # then balanced classes over the collection weights
    plain = triage_model.sample_weights(y, None, 2.0)  # one group: sklearn's balanced weights, silent x2
    silent = LABELS.index("silent")
    assert silent == 0 and plain[0] == pytest.approx(2 * 6 / (2 * 4)) and plain[3] == pytest.approx(6 / (2 * 2))


def test_family_of_tracker():
    assert family_of("vllm-project/vllm-ascend") == "vllm" and family_of("ollama/ollama") == "llama.cpp family"
    assert family_of("abetlen/llama-cpp-python") == "llama.cpp family" and family_of("mudler/LocalAI") == "else"


@pytest.fixture(scope="module")
def small_pool():
    issues = load_issues(REAL)
    pool = []
    for split in ("train", "dev", "test"):  # first-collection splits only, 30 issues each
        part = [i for i in issues if i["split"] == split]
        pool += part[:30]
    return pool


@pytest.mark.slow
def test_nested_estimate_never_reads_the_held_out_labels(small_pool):
    grid = [(4.0, 0.05, 1.0)]
    held = triage_model.HeldOut(small_pool, grid, mask=True, balance=True)
    first = triage_model.nested_estimate(held, held.split, ["dev"], ("dev", "test"))
    dev = held.split == "dev"
    assert (first["pred"][dev] >= 0).all() and (first["pred"][~dev] == -1).all()
    # relabel the held-out collection: every fit, threshold and setting that answered it is unchanged
    flipped = [
        dict(i, label=LABELS[(LABELS.index(i["label"]) + 1) % len(LABELS)]) if i["split"] == "dev" else i
        for i in small_pool
    ]
    again = triage_model.nested_estimate(
        triage_model.HeldOut(flipped, grid, mask=True, balance=True), held.split, ["dev"], ("dev", "test")
    )
    assert (again["pred"] == first["pred"]).all() and again["chosen"] == first["chosen"]
    # the fit without dev serves the held-out answer; the inner fits exclude dev and one more split each
    assert len(held.cache) == 1 + 2  # without dev; without dev+train; without dev+test


@pytest.mark.slow
def test_honest_report_prints_nested_old_and_rules_figures_per_collection_and_family(small_pool):
    from benchmark.triage_eval import honest_report

    text = honest_report(small_pool, ("train", "dev", "test"), ("dev", "test"))
    lines = text.splitlines()
    for name in ("nested pooled", "old leave-one-split-out dev", "rules alone test", "family held out: vllm"):
        assert any(line.startswith(name) for line in lines), name
    assert any(line.startswith("chosen without dev:") for line in lines)
