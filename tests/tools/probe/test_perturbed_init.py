"""`perturb_init`: weights the factory leaves constant (biases 0, norm weights 1, gemma's w 0) get
seeded noise, so a dropped bias or a norm that ignores its weight shows up. Without it such a bug
computes the same numbers as the correct engine: a sweep would pass it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.faults import buggy_tinyserve
from tools.probe.checkpoints import ensure_checkpoint, hf_config_keys, write_checkpoint
from tools.probe.prober import Prober
from tools.scenario import from_dict

QKV_BIAS_DROPPED = ("return F.linear(x, self.weight, self.bias)", "return F.linear(x, self.weight)")
LINEAR = Path("tinyserve/layers/linear.py")


def weights(model: dict) -> dict[str, torch.Tensor]:
    return load_file(str(ensure_checkpoint(model) / "model.safetensors"))


@pytest.mark.parametrize("arch", ["qwen2", "gemma2"])
def test_only_the_constant_tensors_change_and_the_same_seed_gives_the_same_noise(arch, tmp_path):
    plain = {"arch": arch, "seed": 4, "num_hidden_layers": 1}
    perturbed = {**plain, "perturb_init": True}
    assert "perturb_init" not in hf_config_keys(perturbed)
    a, b = weights(plain), weights(perturbed)
    assert ensure_checkpoint(perturbed) != ensure_checkpoint(plain) and a.keys() == b.keys()
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    constant = {k for k in a if a[k].numel() > 1 and bool((a[k] == a[k].reshape(-1)[0]).all())}
    assert changed == constant and any("norm" in k for k in changed)
    if arch == "qwen2":
        assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"} <= changed
    assert all(0.05 < float(b[k].std()) < 0.2 for k in changed)  # noise of about PERTURB_STD, not a rescale
    write_checkpoint(perturbed, tmp_path)  # built anew, not read from the cache
    again = load_file(str(tmp_path / "model.safetensors"))
    assert all(torch.equal(again[k], b[k]) for k in b)


def scenario(perturb: bool) -> dict:
    model = {"arch": "qwen2", "seed": 0, **({"perturb_init": True} if perturb else {})}
    reqs = [{"prompt_ids": list(range(40, 60)), "max_tokens": 4, "sampling": {"ignore_eos": True}}]
    return {
        "model": model,
        "target": {"engine": "tinyserve", "dtype": "float32", "options": {}},
        "workload": {"requests": reqs},
    }


def test_a_dropped_bias_is_seen_only_with_perturbed_weights_and_the_clean_engine_agrees(tmp_path):
    tree = buggy_tinyserve(tmp_path / "nobias", *QKV_BIAS_DROPPED, file=LINEAR)
    prober = Prober()
    clean = prober.probe(from_dict(scenario(perturb=True)))
    assert clean.divergent_taps == [] and not clean.diverged, clean.summary
    hidden = prober.probe(from_dict(scenario(perturb=False)), tree)
    assert hidden.divergent_taps == [], "zero biases: dropping them changes nothing"
    seen = prober.probe(from_dict(scenario(perturb=True)), tree)
    assert seen.diverged and seen.divergent_taps[0].startswith("layers.0."), seen.summary


def test_the_clean_engine_agrees_on_perturbed_gemma2_in_bf16():
    from tests.tools.probe.test_no_false_alarms_tinyserve import EVERYTHING
    from tests.tools.probe.test_no_false_alarms_tinyserve import scenario as matrix_scenario

    sc = matrix_scenario("gemma2", "bfloat16", **EVERYTHING)
    sc["model"]["perturb_init"] = True
    result = Prober().probe(from_dict(sc))
    assert result.divergent_taps == [] and not result.diverged, result.summary


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_no_false_alarms_on_perturbed_weights(arch, dtype):
    from tests.tools.probe.test_no_false_alarms_tinyserve import EVERYTHING
    from tests.tools.probe.test_no_false_alarms_tinyserve import scenario as matrix_scenario

    sc = matrix_scenario(arch, dtype, **EVERYTHING)
    sc["model"]["perturb_init"] = True
    result = Prober().probe(from_dict(sc))
    assert result.divergent_taps == [] and not result.diverged, f"{arch} {dtype}: {result.summary}"


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_mlp_input_outliers_scale_one_channel_in_sixteen_of_the_mlp_input_norm_only(arch):
    plain = {"arch": arch, "seed": 5, "num_hidden_layers": 1, "perturb_init": True}
    a, b = weights(plain), weights({**plain, "mlp_input_outliers": 200.0})
    norm = "model.layers.0." + ("pre_feedforward_layernorm" if arch == "gemma2" else "post_attention_layernorm")
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    assert changed == {f"{norm}.weight"}  # attention's inputs and every other tensor as they were
    scale = (lambda w: 1 + w) if arch == "gemma2" else (lambda w: w)  # gemma's norms scale by 1 + w
    ratio = scale(b[f"{norm}.weight"]) / scale(a[f"{norm}.weight"])
    outliers = torch.zeros_like(ratio, dtype=torch.bool)
    outliers[::16] = True
    assert torch.allclose(ratio[outliers], torch.full_like(ratio[outliers], 200.0), rtol=1e-4)
    assert torch.equal(ratio[~outliers], torch.ones_like(ratio[~outliers]))
