"""Bug-free tinyserve matches transformers (a fast subset of benchmark/subjects/check_tinyserve.py)."""

import pytest
import torch

from benchmark.subjects import check_tinyserve as check

torch.set_num_threads(1)

CASES = [
    ("llama", "float32", "staggered4", check.engine_options(True, True, 4)),
    ("qwen2", "float32", "batch4", check.engine_options(False, False, 16)),
    ("mistral", "float32", "batch1", check.engine_options(False, True, 16)),
    ("mistral", "float32", "staggered4", check.engine_options(True, False, 4)),
    ("gemma2", "float32", "staggered4", check.engine_options(True, True, 4)),
    ("gemma2", "float32", "batch4", check.engine_options(False, False, 16)),
    ("llama", "bfloat16", "staggered4", check.engine_options(True, True, 16)),
    ("gemma2", "bfloat16", "batch4", check.engine_options(True, True, 4)),
]


@pytest.mark.parametrize(
    "arch,dtype,workload,options",
    CASES,
    ids=[
        f"{a}-{d}-{w}-{'pc' if o['enable_prefix_caching'] else 'nopc'}-"
        f"{'chunk' if o['enable_chunked_prefill'] else 'nochunk'}-bs{o['block_size']}"
        for a, d, w, o in CASES
    ],
)
def test_greedy_matches_transformers(arch, dtype, workload, options):
    row = check.check_case(arch, dtype, workload, options)
    assert row["ok"], row
    if dtype == "float32":
        assert row["top1"] == 1.0 and row["logprob_err"] <= check.FP32_LOGPROB_TOL


def test_prefix_cache_hits_and_still_matches():
    """Staggered requests sharing a 36-token prefix reuse cached blocks."""
    row = check.check_case("llama", "float32", "staggered4", check.engine_options(True, False, 4))
    assert row["ok"] and row["prefix_hit_tokens"] >= 32, row


def test_preemption_by_recompute_matches():
    """A cache too small for the batch forces preemptions; outputs must not change."""
    row = check.check_case("gemma2", "float32", "batch4", check.engine_options(True, True, 4, num_kv_blocks=24))
    assert row["ok"] and row["preemptions"] > 0, row


def test_all_native_kernels_match():
    row = check.check_case(
        "mistral", "float32", "staggered4", check.engine_options(False, True, 16, native_kernels=check._all_kernels())
    )
    assert row["ok"], row


def test_wrong_sliding_window_is_detected():
    """Negative control: dropping mistral's sliding window must fail the check (the test has teeth)."""
    from tinyserve.config import ModelConfig

    from tools.probe.checkpoints import ensure_checkpoint

    ckpt = str(ensure_checkpoint({"arch": "mistral", "seed": 0}))
    cfg = ModelConfig.from_dir(ckpt)
    cfg.sliding_windows = [None] * cfg.num_hidden_layers
    prompts = check.make_prompts(1)
    _, outputs = check.run_tinyserve(ckpt, prompts, [0], "float32", {"model_config": cfg})
    assert not check.compare(ckpt, "float32", prompts, outputs)["ok"]
