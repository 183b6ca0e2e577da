"""With refmodel as the reference, correct targets show zero divergent taps (issue 12's
false-alarm matrix): transformers and the bug-free tinyserve, float32 and bfloat16."""

from __future__ import annotations

import pytest

from tests.tools.probe.test_no_false_alarms_tinyserve import EVERYTHING, scenario
from tools.probe.prober import Prober
from tools.scenario import from_dict

TARGETS = {"transformers": {}, "tinyserve": EVERYTHING}
CONFIGS = [("gemma2", "bfloat16", "transformers"), ("llama", "float32", "tinyserve")]
FULL = [(a, d, t) for a in ("llama", "qwen2", "mistral", "gemma2") for d in ("float32", "bfloat16") for t in TARGETS]


def refmodel_scenario(arch: str, dtype: str, target: str) -> dict:
    sc = scenario(arch, dtype, **TARGETS[target])
    sc["target"]["engine"] = target
    sc["reference"] = {"engine": "refmodel"}
    # a sampled request with top-k truncation and a penalty: a boundary token that flips under bf16
    # noise is "undecided" for the sampler comparison (tools/probe/sampler_taps.py), never an alarm
    sc["workload"]["requests"][2]["sampling"] = {
        "ignore_eos": True,
        "temperature": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.1,
        "seed": 3,
    }
    return sc


def _check(arch, dtype, target):
    result = Prober().probe(from_dict(refmodel_scenario(arch, dtype, target)))
    assert result.target.engine == target
    assert result.divergent_taps == [], f"{arch} {dtype} {target}: {result.summary}"
    assert not result.diverged, result.summary
    assert len(result.stats) > 30  # taps were compared, not skipped


@pytest.mark.parametrize("arch,dtype,target", CONFIGS)
def test_refmodel_reference_raises_no_false_alarm(arch, dtype, target):
    _check(arch, dtype, target)


@pytest.mark.slow
@pytest.mark.parametrize("arch,dtype,target", FULL)
def test_refmodel_reference_false_alarm_matrix(arch, dtype, target):
    _check(arch, dtype, target)
