"""The bug-free tinyserve shows zero divergent taps against transformers (DESIGN §3 calibration)."""

from __future__ import annotations

import pytest

from tools.probe.prober import Prober
from tools.scenario import from_dict

SHARED = list(range(40, 76))  # a 36-token prefix shared by later requests


def scenario(arch: str, dtype: str, **options) -> dict:
    reqs = [
        {"prompt_ids": SHARED + [7, 9, 11, 13], "max_tokens": 6},
        {"prompt_ids": SHARED + [21, 23], "max_tokens": 6, "arrival_step": 2},
        {"prompt_ids": list(range(300, 311)), "max_tokens": 6, "arrival_step": 1},
    ]
    for r in reqs:
        r["sampling"] = {"ignore_eos": True}
    return {
        "model": {"arch": arch, "seed": 0},
        "target": {"engine": "tinyserve", "dtype": dtype, "options": options},
        "workload": {"requests": reqs},
    }


EVERYTHING = dict(enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=16, block_size=4)
CONFIGS = [
    ("llama", "float32", EVERYTHING),
    ("mistral", "bfloat16", EVERYTHING),
    ("gemma2", "bfloat16", {}),
    ("qwen2", "float32", {"block_size": 16}),
]
FULL = [
    (a, d, o)
    for a in ("llama", "qwen2", "mistral", "gemma2")
    for d in ("float32", "bfloat16")
    for o in ({}, EVERYTHING)
]


def _check(arch, dtype, options):
    result = Prober().probe(from_dict(scenario(arch, dtype, **options)))
    assert result.divergent_taps == [], f"{arch} {dtype} {options}: {result.summary}"
    assert not result.diverged, result.summary


@pytest.mark.parametrize("arch,dtype,options", CONFIGS)
def test_bug_free_tinyserve_has_no_divergent_taps(arch, dtype, options):
    _check(arch, dtype, options)


@pytest.mark.slow
@pytest.mark.parametrize("arch,dtype,options", FULL)
def test_bug_free_tinyserve_full_matrix(arch, dtype, options):
    _check(arch, dtype, options)
