"""`python -m agent.triage classify` (the docs/design.md §8 contract) and the rules behind it."""

import json
import subprocess
import sys
from pathlib import Path

from benchmark.triage_eval import SYNTHETIC, evaluate, load_issues, predict
from tools.triage.rules import classify

ROOT = Path(__file__).resolve().parents[2]


def test_classify_cli_output_is_aligned_json(tmp_path):
    lines = [
        json.dumps({"title": "Gibberish after 4k tokens", "body": "No error in the logs.", "id": 1}),
        "this is not json",
        "",
        json.dumps({"title": "[Feature]: support for Jamba", "body": "would be nice"}),
        json.dumps(["a list"]),
        json.dumps({"title": "pip install fails", "body": "ERROR: Failed building wheel for vllm"}),
    ]
    f = tmp_path / "issues.jsonl"
    f.write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "agent.triage", "classify", str(f)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert len(out) == 5  # the blank line is not an issue
    assert [o["label"] for o in out] == ["silent", "other", "feature", "other", "install"]
    assert all(0.0 <= o["confidence"] <= 1.0 for o in out)
    assert out[1]["confidence"] == 0.0 and "line 2" not in out[1].get("label", "")
    assert ":2: not valid JSON" in proc.stderr and ":5: expected a JSON object" in proc.stderr


def test_traceback_in_a_code_block_is_a_crash_even_if_it_says_wrong():
    body = 'The token ids are wrong?\n```\nTraceback (most recent call last):\n  File "g.py", line 1\nIndexError: index out of range in self\n```'
    assert classify("generate() fails after adding tokens", body).label == "crash"


def test_incidental_exception_does_not_make_a_silent_error_a_crash():
    body = (
        "The second request returns a wrong answer; there is no error for that.\n"
        "Side note: Ctrl-C prints an asyncio CancelledError traceback, unrelated.\n"
        "```\nTraceback (most recent call last):\nasyncio.exceptions.CancelledError\n```"
    )
    assert classify("Prefix caching gives wrong answers", body).label == "silent"


def test_import_error_traceback_is_an_install_problem():
    body = "```\nTraceback (most recent call last):\n  File \"<string>\", line 1\nModuleNotFoundError: No module named 'vllm._C'\n```"
    assert classify("after pip install -e .", body).label == "install"


def test_template_tags_and_env_dumps():
    env = "```\nCollecting environment information...\nPyTorch version: 2.3\nnvcc: NVIDIA (R) Cuda compiler\n```"
    assert classify("[Usage]: how do I use two GPUs?", env).label == "question"
    assert classify("[Performance]: slow prefill", env).label == "performance"
    assert classify("", "").label == "other"


def test_correlation_and_zero_accuracy_against_a_reference_are_wrong_results():
    # written for this test (LABELING.md: correctness tests on accelerator stacks are `silent`)
    assert (
        classify("Mistral 7B decode test fails with low PCC", "PCC 0.91 against the torch reference.").label == "silent"
    )
    assert classify("PCC dropped to 0.95 after the kernel change", "").label == "silent"
    assert classify("Converted model: accuracy is 0 on the eval set", "").label == "silent"


def test_a_tag_does_not_outweigh_a_title_that_asks_how():
    # "how to / is there a way" is a usage question also under a [Feature] or [Installation] tag
    assert classify("[Feature]: Is there a way to stream the logprobs too?", "").label == "question"
    assert classify("[Feature]: stream the logprobs too", "").label == "feature"


def test_framing_cues_of_feature_requests_crashes_and_builds():
    assert classify("When support Gemma 4 on iOS", "").label == "feature"
    assert classify("希望支持一下新的多模态模型", "").label == "feature"
    assert classify("[Model Request] Phi-4-mini", "").label == "feature"
    assert classify("The road map for next quarter?", "").label == "other"
    assert classify("安卓手机上发送消息后闪退", "").label == "crash"
    assert classify("Build the runtime from the release tarball occurs error", "").label == "install"
    assert classify("Build engine failed for the 70B checkpoint", "").label == "crash"


def test_triage_eval_silent_precision_and_recall_on_the_synthetic_set():
    issues = load_issues(SYNTHETIC)
    assert len(issues) >= 80
    assert 0.35 <= sum(i["label"] == "silent" for i in issues) / len(issues) <= 0.45
    figures = evaluate(issues, predict(issues, "rules"))
    assert figures["all"]["silent"]["precision"] >= 0.9
    assert figures["all"]["silent"]["recall"] >= 0.9
    assert figures["heldout"]["accuracy"] >= 0.8


def test_triage_eval_splits_reads_and_scores_only_those_splits(tmp_path):
    """`--splits` restricts what is classified and scored, so a held-out split is never touched by a score of
    another; predictions given are kept aligned with the issues they answer."""
    from benchmark.triage_eval import main

    issues = load_issues(SYNTHETIC)
    held = sorted({i["split"] for i in issues})
    assert len(held) >= 2
    out = tmp_path / "figures.json"
    assert main(["--issues", str(SYNTHETIC), "--classifier", "rules", "--splits", held[0], "--out", str(out)]) == 0
    figures = json.loads(out.read_text())["figures"]
    assert set(figures) == {"all", held[0]}
    assert figures["all"]["n"] == figures[held[0]]["n"] == sum(i["split"] == held[0] for i in issues)
    preds = tmp_path / "preds.jsonl"  # every line 'silent': the selection's precision is its share of silent issues
    preds.write_text("".join(json.dumps({"label": "silent", "confidence": 1.0}) + "\n" for _ in issues))
    assert main(["--issues", str(SYNTHETIC), "--predictions", str(preds), "--splits", held[-1], "--out", str(out)]) == 0
    chosen = [i for i in issues if i["split"] == held[-1]]
    silent = json.loads(out.read_text())["figures"][held[-1]]["silent"]
    assert silent["precision"] == round(sum(i["label"] == "silent" for i in chosen) / len(chosen), 3)
