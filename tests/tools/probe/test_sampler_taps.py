"""Sampler taps judged as sampling find real sampler bugs, in bf16 too (issue 16).

Each bug is a one-line change to a copy of the bundled tinyserve's sampler, probed as the tree
under test: the comparison must see through bf16 noise at the cuts without hiding a wrong cut.
"""

from __future__ import annotations

import pytest

from tests.faults import MIN_P_HALVED, TOP_K_OFF_BY_ONE, buggy_tinyserve
from tools.probe.prober import Prober
from tools.scenario import from_dict


def sampled(dtype: str, **sampling) -> dict:
    prompts = [[5, 17, 42, 99, 260, 301, 7, 8, 9, 10, 11], list(range(40, 58))]
    return {
        "model": {"arch": "llama", "seed": 0},
        "target": {"engine": "tinyserve", "dtype": dtype},
        "workload": {
            "requests": [
                {
                    "prompt_ids": p,
                    "max_tokens": 8,
                    "sampling": {"temperature": 0.8, "seed": 11 + i, "ignore_eos": True, **sampling},
                }
                for i, p in enumerate(prompts)
            ]
        },
    }


@pytest.mark.parametrize(
    "fault,sampling",
    [(TOP_K_OFF_BY_ONE, {"top_k": 40}), (MIN_P_HALVED, {"min_p": 0.6})],
    ids=["top-k-off-by-one", "min-p-halved"],
)
def test_a_wrong_cut_is_found_at_sampler_probs_in_bf16(tmp_path, fault, sampling):
    tree = buggy_tinyserve(tmp_path, *fault)
    result = Prober().probe(from_dict(sampled("bfloat16", **sampling)), tree)
    assert result.first is not None and result.first.tap == "sampler.probs", result.summary
    assert set(result.divergent_taps) <= {"sampler.probs", "sampler.token"}  # nothing upstream moved
