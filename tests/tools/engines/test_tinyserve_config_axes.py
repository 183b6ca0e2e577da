"""tinyserve's model-config axis (the sweep's checkpoint config variants): each variant is a real
tiny checkpoint that both tinyserve and transformers load, written the way users ship it, and the
bug-free tinyserve agrees with transformers on it."""

import json

import pytest

from tools.engines.tinyserve import CONFIG_AXES, TinyServeEngine
from tools.probe.checkpoints import TINY_PRESETS, ensure_checkpoint
from tools.probe.prober import Prober
from tools.scenario import EngineSpec
from tools.sweep.matrix import Cell, ConfigVariant, scenario_of

VARIANTS = {a.name: ConfigVariant(dict(a.model), tuple(a.archs)) for a in CONFIG_AXES}
TARGET = EngineSpec("tinyserve", "float32", {})


def probe(arch: str, config: str, dtype: str = "float32", workload: str = "long"):
    sc = scenario_of(Cell(arch, dtype, "none", workload, config), TARGET, {}, None, VARIANTS)
    return sc, Prober().probe(sc, None)


def test_the_adapter_declares_config_axes_as_plain_data():
    caps = TinyServeEngine().capabilities()
    assert {a.name for a in caps.config_axes} == set(VARIANTS)
    assert all(a.model for a in caps.config_axes)  # a variant is a checkpoint; some also carry engine options
    assert all(set(a.archs) <= set(TINY_PRESETS) for a in caps.config_axes)
    back = type(caps).from_json(json.loads(json.dumps(caps.to_json()))).config_axes  # as a worker sends them
    assert [(a.name, a.archs, json.dumps(a.model), json.dumps(a.options)) for a in back] == [
        (a.name, a.archs, json.dumps(a.model), json.dumps(a.options)) for a in caps.config_axes
    ]


def test_a_legacy_llama3_rope_checkpoint_loads_in_both_and_agrees():
    sc, result = probe("llama", "rope_llama3")
    config = json.loads((ensure_checkpoint(sc.model) / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] == "llama3" and "rope_parameters" not in config
    assert not result.diverged, result.summary


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,config", [(arch, name) for name, v in VARIANTS.items() for arch in TINY_PRESETS if v.fits(arch)]
)
def test_every_config_variant_agrees_on_every_arch_that_ships_it(arch, config):
    _, result = probe(arch, config)
    assert not result.diverged, result.summary


def test_an_untied_gemma2_head_is_its_own_matrix_and_the_engine_reads_it():
    """Gemma 2 exports usually tie lm_head to the embedding; a fine-tune saved untied carries its own head.
    The variant writes such a checkpoint (the head's weights differ from the embedding's) and the bug-free
    engine, which must use that head, agrees with transformers on it."""
    from safetensors.torch import load_file

    sc, result = probe("gemma2", "untied_head")
    folder = ensure_checkpoint(sc.model)
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is False
    weights = load_file(str(next(folder.glob("*.safetensors"))))
    head = next(v for k, v in weights.items() if k.endswith("lm_head.weight"))
    embed = next(v for k, v in weights.items() if k.endswith("embed_tokens.weight"))
    assert head.shape == embed.shape and not bool((head == embed).all())
    assert not result.diverged, result.summary
