"""Seeded checkpoints: the factory contract (same seed and keys, same weights)."""

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tools.probe.checkpoints import ensure_checkpoint, model_config_keys


def test_factory_matches_the_documented_recipe(tmp_path):
    model = {"arch": "qwen2", "seed": 5, "num_hidden_layers": 1}
    path = ensure_checkpoint(model)
    assert ensure_checkpoint(dict(model)) == path  # cached, same key
    config = AutoConfig.for_model("qwen2", **model_config_keys(model))
    torch.manual_seed(5)
    expected = AutoModelForCausalLM.from_config(config, dtype=torch.float32).state_dict()
    saved = load_file(str(path / "model.safetensors"))
    assert all(torch.equal(saved[k], expected[k]) for k in saved)


def test_tokenizer_round_trips_multibyte_text():
    path = ensure_checkpoint({"arch": "llama", "seed": 0})
    tok = AutoTokenizer.from_pretrained(path)
    text = "Héllo wörld, 東京 and the cache"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert len(tok) == 512


def test_file_keys_edit_config_json_and_leave_the_weights(tmp_path):
    """omit_keys / config_json write a checkpoint the way older or hand-made configs look; the
    weights are those of the same keys without them, and transformers still loads it."""
    import json

    plain = {"arch": "llama", "seed": 3, "num_hidden_layers": 1}
    legacy = {
        **plain,
        "omit_keys": ["rope_parameters", "head_dim", "rms_norm_eps"],
        "config_json": {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
    }
    path = ensure_checkpoint(legacy)
    assert path != ensure_checkpoint(plain)
    config = json.loads((path / "config.json").read_text())
    assert not {"rope_parameters", "head_dim", "rms_norm_eps"} & set(config)
    assert config["rope_scaling"] == {"type": "linear", "factor": 2.0} and config["rope_theta"] == 10000.0
    a, b = load_file(str(path / "model.safetensors")), load_file(str(ensure_checkpoint(plain) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    loaded = AutoConfig.from_pretrained(path)
    assert loaded.rope_parameters["rope_type"] == "linear" and loaded.rope_parameters["factor"] == 2.0
    assert loaded.rms_norm_eps == 1e-6  # transformers' default, read back where the key is left out
