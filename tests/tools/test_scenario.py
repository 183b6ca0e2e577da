"""Scenario contract: parsing, defaults and clear errors."""

import pytest

from tools.scenario import ScenarioError, from_dict, loads

GOOD = """
good_ref = "v0.4"
[model]
arch = "llama"
seed = 3
hidden_size = 64
[target]
engine = "tinyserve"
dtype = "bfloat16"
options = { enable_prefix_caching = true }
[[workload.requests]]
prompt_ids = [1, 17, 42]
max_tokens = 4
sampling = { temperature = 0.0 }
arrival_step = 2
[[workload.requests]]
prompt = "hello"
"""


def test_good_scenario_round_trips():
    sc = loads(GOOD)
    assert sc.good_ref == "v0.4" and sc.target.options == {"enable_prefix_caching": True}
    assert sc.reference.engine == "transformers" and sc.reference.dtype == "float64"
    assert sc.requests[0].arrival_step == 2 and sc.requests[1].prompt == "hello"
    assert from_dict(sc.to_dict()) == sc


@pytest.mark.parametrize(
    "text,message",
    [
        ("[model]\narch='llama'\n", "target"),
        (GOOD.replace('dtype = "bfloat16"', 'dtype = "bf16"'), "dtype"),
        (GOOD.replace("max_tokens = 4", "max_tokens = 0"), "max_tokens"),
        (GOOD.replace("temperature", "temprature"), "unknown sampling keys"),
        (GOOD.replace('prompt = "hello"', 'prompt = "hello"\nprompt_ids = [1]'), "exactly one"),
        ("[model\n", "not valid TOML"),
    ],
)
def test_malformed_scenarios_say_why(text, message):
    with pytest.raises(ScenarioError, match=message):
        loads(text)


def test_reference_dtype_is_the_trusted_precision_and_is_kept():
    """Regression (issue 16): `[reference] dtype` was accepted and silently ignored."""
    sc = loads(GOOD + '[reference]\nengine = "transformers"\ndtype = "float32"\n')
    assert sc.reference.dtype == "float32" and from_dict(sc.to_dict()) == sc
    with pytest.raises(ScenarioError, match="cannot be the trusted"):
        loads(GOOD + '[reference]\ndtype = "bfloat16"\n')
