"""Function contracts on real transformers releases (the tree under test) with a tiny factory
checkpoint: the release's own mask builder or rope-parameter function is named by its recorded
inputs and output when it computes the wrong thing, and the installed 5.24.0 keeps every contract.

Wheels come from the diffdx cache (PyPI once). CI runs one release; the rest is `-m slow`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmark.releases import unpack_package, wheel_path
from tools.engines.hf_compat import layer_windows
from tools.probe.prober import Prober
from tools.scenario import from_dict

LONG_PROMPT = list(range(40, 82))  # 42 tokens: past the window of 32 below


@pytest.fixture(scope="module")
def release_tree(tmp_path_factory):
    trees: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in trees:
            trees[version] = tmp_path_factory.mktemp(f"transformers-{version}")
            unpack_package(wheel_path("transformers", version), "transformers", trees[version])
        return trees[version]

    return get


def scenario(model: dict, attn: str, prompts: list[list[int]]) -> dict:
    return {
        "model": {"seed": 0, **model},
        "target": {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": attn}},
        "workload": {
            "requests": [{"prompt_ids": p, "max_tokens": 3, "sampling": {"ignore_eos": True}} for p in prompts]
        },
    }


def verdicts(tree: Path, spec: dict) -> dict[str, dict]:
    """'qualname' -> verdict of every judged function of the release's run."""
    meta = Prober().run_target(from_dict(spec), tree, taps=[], function_checks=True).meta
    return {v["function"].split(":")[1]: v for v in meta["function_checks"]}


def broken(found: dict[str, dict]) -> set[str]:
    return {name for name, v in found.items() if v["violations"]}


def test_layer_windows_as_the_reference_reads_the_config():
    qwen2 = {"model_type": "qwen2", "num_hidden_layers": 2, "sliding_window": 32, "use_sliding_window": True}
    assert layer_windows({**qwen2, "layer_types": ["full_attention", "sliding_attention"]}, {}) == [None, 32]
    assert layer_windows({**qwen2, "layer_types": ["sliding_attention"] * 2}, {"use_sliding_window": False}) == [
        None,
        None,
    ]
    assert layer_windows({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 32}, {}) == [32, 32]
    assert layer_windows({"model_type": "llama", "num_hidden_layers": 2, "sliding_window": 16}, {}) == [None, None]


def test_sdpa_mask_without_the_window_is_named_by_its_own_output(release_tree):
    """4.39.3: with no padding the SDPA mask is dropped for is_causal, which has no window
    (huggingface/transformers#28980)."""
    found = verdicts(release_tree("4.39.3"), scenario({"arch": "mistral"}, "sdpa", [LONG_PROMPT]))
    assert broken(found) == {"_prepare_4d_causal_attention_mask_for_sdpa"}
    assert found["_prepare_4d_causal_attention_mask_for_sdpa"]["contract"] == "attention-mask-4d"


@pytest.mark.slow
def test_window_band_off_by_one_breaks_the_builder_and_the_good_release_keeps_it(release_tree):
    """A padded batch under eager: 4.38.2 keeps the band, 4.39.3 moved it one key (#29623); the
    converter's own builder is the violator, its caller breaks only through it."""
    spec = scenario({"arch": "mistral"}, "eager", [LONG_PROMPT, list(range(300, 309))])
    assert broken(verdicts(release_tree("4.38.2"), spec)) == set()
    found = verdicts(release_tree("4.39.3"), spec)
    assert "AttentionMaskConverter._make_causal_mask" in broken(found)
    caller = found["_prepare_4d_causal_attention_mask"]
    assert any(c.endswith("_make_causal_mask") for c in caller["callees"])


@pytest.mark.slow
def test_one_mask_for_layers_of_both_kinds_must_be_the_full_one(release_tree):
    """4.51.3 qwen2 with max_window_layers=1: layer 0 attends fully, yet the one mask slides (#35896)."""
    model = {"arch": "qwen2", "use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1}
    found = verdicts(release_tree("4.51.3"), scenario(model, "eager", [LONG_PROMPT]))
    assert "Qwen2Model._prepare_4d_causal_attention_mask_with_cache_position" in broken(found)


@pytest.mark.slow
def test_yarn_band_from_the_wrong_context_is_named(release_tree):
    model = {
        "arch": "llama",
        "max_position_embeddings": 1024,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    }
    found = verdicts(release_tree("4.50.3"), scenario(model, "eager", [LONG_PROMPT]))
    assert broken(found) == {"_compute_yarn_parameters"}
    assert found["_compute_yarn_parameters"]["contract"] == "rope-config-frequencies"


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, attn",
    [
        ({"arch": "mistral"}, "sdpa"),
        ({"arch": "qwen2", "use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1}, "eager"),
        (
            {
                "arch": "llama",
                "max_position_embeddings": 1024,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
            },
            "eager",
        ),
    ],
)
def test_reference_release_keeps_every_contract(release_tree, model, attn):
    found = verdicts(release_tree("5.24.0"), scenario(model, attn, [LONG_PROMPT, list(range(300, 309))]))
    assert broken(found) == set(), found
