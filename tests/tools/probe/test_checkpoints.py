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
