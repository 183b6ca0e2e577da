"""config-fidelity and quant-roundtrip on real tinyserve trees: a copy with a fault written into its
config reader or its int4 quantizer breaks the contract on that function; the bug-free tree (float32,
bfloat16, int8, int4, a config variant that states more keys) keeps both."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tools.engines.functaps import ModuleWeights, function_taps
from tools.engines.tinyserve import CONFIG_AXES
from tools.hypotheses.contracts import check_model_quantizer, contract_for, judge
from tools.probe.checkpoints import TINY_PRESETS, edited_config, hf_config_keys
from tools.probe.prober import Prober
from tools.scenario import from_dict

TINYSERVE = Path(__file__).resolve().parents[3] / "benchmark" / "subjects" / "tinyserve"
ARCHS = tuple(a for a in TINY_PRESETS if a in ("llama", "qwen2", "mistral", "gemma2"))
PROMPT = [(5 * i + 2) % 400 + 3 for i in range(24)]


def scenario(arch: str, dtype: str, model: dict | None = None, options: dict | None = None):
    return from_dict(
        {
            "model": {"arch": arch, "seed": 1, **(model or {})},
            "target": {"engine": "tinyserve", "dtype": dtype, "options": {"block_size": 16, **(options or {})}},
            "workload": {
                "requests": [
                    {"prompt_ids": PROMPT, "max_tokens": 2, "sampling": {"temperature": 0.0, "ignore_eos": True}}
                ]
            },
        }
    )


def verdicts(sc, tree: Path = TINYSERVE) -> dict[str, dict]:
    found = Prober().run_target(sc, tree, taps=[], function_checks=True).meta["function_checks"]
    return {v["contract"] + " " + v["function"].split(":")[-1]: v for v in found}


def faulty_tree(tmp_path: Path, rel: str, old: str, new: str) -> Path:
    tree = tmp_path / "tinyserve"
    shutil.copytree(TINYSERVE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    path = tree / "tinyserve" / rel
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return tree


def only_contract(found: dict[str, dict], contract: str) -> list[dict]:
    return [v for v in found.values() if v["contract"] == contract]


def test_a_reader_that_reads_the_wrong_eps_key_breaks_config_fidelity(tmp_path: Path):
    tree = faulty_tree(tmp_path, "config.py", 'hf.get("rms_norm_eps", 1e-6)', 'hf.get("layer_norm_eps", 1e-6)')
    found = only_contract(
        verdicts(scenario("llama", "float32", {"config_json": {"rms_norm_eps": 1e-5}}), tree), "config-fidelity"
    )
    assert [v["function"].split(":")[-1] for v in found if v["violations"]] == ["ModelConfig.from_dict"]
    assert found[0]["max_violation"] == pytest.approx(0.9)  # 1e-6 kept where the file states 1e-5


def test_an_int4_scale_over_sixteen_steps_breaks_quant_roundtrip(tmp_path: Path):
    tree = faulty_tree(tmp_path, "quantization.py", "(hi - lo) / 15.0", "(hi - lo) / 16.0")
    found = only_contract(
        verdicts(scenario("llama", "float32", options={"quantization": "int4", "quant_group_size": 32}), tree),
        "quant-roundtrip",
    )
    assert [v["function"].split(":")[-1] for v in found if v["violations"]] == ["quantize_group_int4"]
    assert found[0]["max_violation"] > 0.9  # the largest weight of a group clipped by a whole step


@pytest.mark.parametrize(
    "arch, dtype, model, options",
    [
        ("llama", "float32", {"config_json": {"rms_norm_eps": 1e-5}}, {"quantization": "int4", "quant_group_size": 32}),
        pytest.param("gemma2", "bfloat16", {}, {"quantization": "int8"}, marks=pytest.mark.slow),
        pytest.param(
            "qwen2",
            "float32",
            {"omit_keys": ["rope_parameters"], "config_json": {"rope_theta": 500000.0, "head_dim": 16}},
            {},
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bug_free_tinyserve_keeps_config_fidelity_and_quant_roundtrip(arch, dtype, model, options):
    found = verdicts(scenario(arch, dtype, model, options))
    judged = {v["contract"] for v in found.values()}
    kinds = ("config-fidelity", "quant-roundtrip", "quantize-model")
    broken = [k for k, v in found.items() if v["violations"] and v["contract"] in kinds]
    assert not broken, broken
    assert "config-fidelity" in judged
    assert "quant-roundtrip" in judged or options.get("quantization") != "int4"
    assert "quantize-model" in judged or not options.get("quantization")


def test_a_model_quantizer_that_leaves_one_sibling_projection_in_float_breaks_quantize_model(tmp_path: Path):
    """The quantizer picks the layers it converts and misses one kind: beside each layer's converted
    projections, that one keeps its float weight matrix (nothing any per-weight contract sees)."""
    tree = faulty_tree(
        tmp_path,
        "quantization.py",
        'isinstance(module, LinearBase) and ".layers." in f".{name}"',
        'isinstance(module, LinearBase) and ".layers." in f".{name}" and not name.endswith("o_proj")',
    )
    found = only_contract(
        verdicts(scenario("llama", "float32", options={"quantization": "int4", "quant_group_size": 32}), tree),
        "quantize-model",
    )
    assert [v["function"].split(":")[-1] for v in found if v["violations"]] == ["quantize_linears"]
    assert found[0]["max_violation"] == pytest.approx(0.5)  # qkv_proj converted, o_proj left: half of them


def test_check_model_quantizer_compares_siblings_under_one_parent():
    before = ModuleWeights(frozenset({"embed", "layers.0.a", "layers.0.b", "layers.0.mlp.c", "layers.0.mlp.d", "head"}))
    all_of_them = ModuleWeights(frozenset({"embed", "head"}))
    one_missed = ModuleWeights(frozenset({"embed", "head", "layers.0.b"}))
    none = before
    assert check_model_quantizer({"model": before}, {"model": all_of_them}, {}) == 0.0
    assert check_model_quantizer({"model": before}, {"model": one_missed}, {}) == 0.5
    assert check_model_quantizer({"model": before}, {"model": none}, {}) is None  # converted nothing: no claim
    assert contract_for("quantize_linears", ("model", "scheme", "group_size", "kernel")).name == "quantize-model"
    assert contract_for("quantize_weight", ("w", "scheme", "group_size")).name == "quant-roundtrip"


def reader_verdicts(config: dict) -> list[dict]:
    """config-fidelity verdicts of tinyserve's own config reader given `config`, in this process."""
    import importlib.util

    path = TINYSERVE / "tinyserve" / "config.py"
    spec = importlib.util.spec_from_file_location("tinyserve_config_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    with function_taps(str(TINYSERVE), lambda q, p: contract_for(q, p) is not None) as calls:
        module.ModelConfig.from_dict(config)
    return [v for v in judge(calls, {}) if v["contract"] == "config-fidelity"]


def written_config(model: dict) -> dict:
    """config.json as tools.probe.checkpoints writes it for a [model] table (no weights)."""
    from transformers import AutoConfig

    written = AutoConfig.for_model(model["arch"], **hf_config_keys(model)).to_dict()
    return edited_config(written, model)


def test_tinyserves_config_reader_keeps_config_fidelity_on_every_arch_and_config_variant():
    variants = [({}, ARCHS)] + [(dict(a.model), tuple(a.archs) or ARCHS) for a in CONFIG_AXES]
    judged = 0
    for model, archs in variants:
        for arch in archs:
            found = reader_verdicts(written_config({"arch": arch, **model}))
            assert [v for v in found if v["violations"]] == [], (arch, model, found)
            judged += len(found)
    assert judged >= len(variants)


def test_a_reader_that_drops_a_stated_value_breaks_config_fidelity():
    config = written_config({"arch": "gemma2", "rms_norm_eps": 1e-5, "final_logit_softcapping": 7.0})
    assert [v["violations"] for v in reader_verdicts(config)] == [0]
    fake = {**config, "final_logit_softcapping": 7.0, "model_type": "llama"}  # the llama reader drops softcaps
    (v,) = reader_verdicts(fake)
    assert v["violations"] == 1 and v["max_violation"] == 1.0
