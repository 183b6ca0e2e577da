"""Contract checks never flag a bug-free tree: bug-free tinyserve on llama and gemma2, float32 and
bfloat16, with greedy and filtered/penalised sampling in one batch, keeps every contract it is
judged by (and is judged by enough of them for that to mean something)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.probe.prober import Prober
from tools.scenario import from_dict

TINYSERVE = Path(__file__).resolve().parents[3] / "benchmark" / "subjects" / "tinyserve"
PROMPT = [(7 * i + 3) % 500 + 3 for i in range(40)]  # longer than the sliding window (32) of gemma2
SAMPLED = {
    "temperature": 0.8,
    "top_k": 8,
    "top_p": 0.9,
    "min_p": 0.05,
    "repetition_penalty": 1.2,
    "presence_penalty": 0.3,
    "frequency_penalty": 0.2,
    "seed": 4,
    "ignore_eos": True,
}


def scenario(arch: str, dtype: str, model: dict | None = None, options: dict | None = None):
    return from_dict(
        {
            "model": {"arch": arch, "seed": 0, **(model or {})},
            "target": {"engine": "tinyserve", "dtype": dtype, "options": {"block_size": 16, **(options or {})}},
            "workload": {
                "requests": [
                    {"prompt_ids": PROMPT, "max_tokens": 4, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                    {"prompt_ids": PROMPT[:20] * 2, "max_tokens": 4, "sampling": SAMPLED},
                ]
            },
        }
    )


def verdicts(sc) -> list[dict]:
    return Prober().run_target(sc, TINYSERVE, taps=[], function_checks=True).meta["function_checks"]


def assert_no_contract_fires(found: list[dict], expected: set[str]) -> None:
    broken = [
        f"{v['function']} {v['contract']}: {v['max_violation']:.3g} > {v['tolerance']:.3g}"
        for v in found
        if v["violations"]
    ]
    assert not broken, broken
    assert expected <= {v["contract"] for v in found}


COMMON = {
    "rms-norm",
    "softcap",
    "attention-mask",
    "paged-attention",
    "kv-cache-write",
    "rope-frequencies",
    "rope-cos-sin",
    "rope-rotation",
    "top-k",
    "top-p",
    "min-p",
    "penalty",
    "penalty-state",
    "temperature",
}


@pytest.mark.parametrize(
    "arch, dtype",
    [
        ("llama", "float32"),
        pytest.param("llama", "bfloat16", marks=pytest.mark.slow),
        pytest.param("gemma2", "float32", marks=pytest.mark.slow),
        pytest.param("gemma2", "bfloat16", marks=pytest.mark.slow),
    ],
)
def test_bug_free_tinyserve_keeps_every_contract(arch: str, dtype: str):
    activation = "gated-activation"
    assert_no_contract_fires(verdicts(scenario(arch, dtype)), COMMON | {activation})


@pytest.mark.slow
def test_bug_free_tinyserve_keeps_the_scaled_rope_and_int8_contracts():
    rope = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}}
    found = verdicts(scenario("llama", "float32", rope, {"quantization": "int8"}))
    assert_no_contract_fires(found, {"int8-quantizer", "rope-cos-sin", "rope-frequencies"})


@pytest.mark.parametrize(
    "arch, dtype",
    [("llama", "bfloat16"), pytest.param("gemma2", "float32", marks=pytest.mark.slow)],
)
def test_bug_free_tinyserve_keeps_the_attention_contract_with_chunks_and_cached_prefixes(arch, dtype):
    """Chunked prefill over a cached prefix: packed rows that sit past cached tokens, small blocks."""
    options = {"enable_prefix_caching": True, "enable_chunked_prefill": True, "max_num_batched_tokens": 16}
    found = verdicts(scenario(arch, dtype, options={**options, "block_size": 4}))
    assert_no_contract_fires(found, {"paged-attention", "kv-cache-write", "attention-mask", "top-p", "penalty"})


def test_contracts_judged_on_the_coverage_run_are_those_of_a_run_of_their_own():
    """gather judges the contracts on its coverage run (one engine run, not two): the verdicts and
    the covered functions are the ones each recorder gives in a run of its own."""
    sc = scenario("llama", "float32")
    prober = Prober()
    both = prober.run_target(sc, TINYSERVE, taps=[], coverage=True, function_checks=True).meta
    alone = prober.run_target(sc, TINYSERVE, taps=[], function_checks=True).meta["function_checks"]
    covered = prober.run_target(sc, TINYSERVE, taps=[], coverage=True).meta["coverage"]
    assert both["function_checks"] == alone and alone
    assert both["coverage"] == covered and covered
