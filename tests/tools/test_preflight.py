"""Up-front checks (tools/preflight.py), in process: each bad input is refused with a line that
says what to change; good input passes and names the source tree to use."""

from pathlib import Path

import pytest

from tools.errors import BadInput
from tools.preflight import canonical_taps, check_limits, check_taps, check_target_source, model_config, preflight
from tools.scenario import loads

SCENARIO = """
[model]
arch = "llama"
num_hidden_layers = 3
[target]
engine = "tinyserve"
options = { block_size = 16, prefix_caching = true }
[[workload.requests]]
prompt_ids = [1, 2, 3]
max_tokens = 8
"""


def test_good_input_passes_and_resolves_the_source(tmp_path):
    (tmp_path / "tinyserve").mkdir()
    assert preflight(loads(SCENARIO), tmp_path, ["layers.2.*", "logits"]) == tmp_path.resolve()
    assert preflight(loads(SCENARIO)) is None


def test_taps_are_checked_against_the_model_s_layers():
    config = model_config(loads(SCENARIO).model)
    assert "layers.2.out" in canonical_taps(config) and "layers.3.out" not in canonical_taps(config)
    check_taps(["layers.*.attn.q", "sampler.*"], config)
    with pytest.raises(BadInput, match="'layers.3.out' matches no tap"):
        check_taps(["embed", "layers.3.out"], config)


def test_limits_use_the_model_s_positions():
    sc = loads(SCENARIO.replace("max_tokens = 8", "max_tokens = 1022"))
    check_limits(sc, {"max_position_embeddings": 1025, "vocab_size": 512})
    with pytest.raises(BadInput, match=r"prompt \(3 tokens\) \+ max_tokens \(1,022\) exceeds the model's 1024"):
        check_limits(sc, {"max_position_embeddings": 1024})


def test_target_source_must_hold_the_engine_package(tmp_path):
    with pytest.raises(BadInput, match="holds no `transformers/` package"):
        check_target_source("transformers", tmp_path)
    (tmp_path / "transformers").mkdir()
    with pytest.raises(BadInput, match=f"did you mean its parent {tmp_path}"):
        check_target_source("transformers", tmp_path / "transformers")


def test_unknown_option_suggests_the_close_name():
    sc = loads(SCENARIO.replace("prefix_caching = true", "prefix_cachin = true"))
    with pytest.raises(BadInput, match="did you mean prefix_caching"):
        preflight(sc)


def test_model_path_without_config(tmp_path):
    sc = loads(SCENARIO.replace('arch = "llama"', f'path = "{Path(tmp_path)}"'))
    with pytest.raises(BadInput, match="has no config.json"):
        preflight(sc)


def test_dynamic_ntk_past_the_limit_is_refused_with_the_reason():
    """Found while checking a dropped hard case: past max_position_embeddings with dynamic NTK RoPE,
    bug-free tinyserve parts from the teacher-forced reference at layers.0.attn.q_rot (ratio 1.1e4):
    the single reference forward rescales the prompt's positions too, the KV-cached engine does not."""
    sc = loads(SCENARIO.replace("max_tokens = 8", "max_tokens = 1022"))
    dynamic = {"max_position_embeddings": 1024, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    with pytest.raises(
        BadInput, match=r"exceeds the model's 1024 positions .*dynamic NTK RoPE past it is not comparable"
    ):
        check_limits(sc, dynamic)
    with pytest.raises(BadInput) as plain:
        check_limits(sc, {"max_position_embeddings": 1024, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert "dynamic" not in str(plain.value)
