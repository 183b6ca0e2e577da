"""The transformers adapter across releases: a real PyPI release (the tree under test) against the
installed 5.24.0 (reference), on the same factory checkpoint, greedy fp32, bug-free.

Wheels and each release's era dependencies are fetched once per test session (PyPI needed, or a
warm $DIFFDX_TEST_CACHE). CI runs one cell of the matrix; the rest is `-m slow`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmark.releases import unpack_package, wheel_path
from tools.engines.hf_compat import missing_requirements, release_compat_keys, tree_version
from tools.engines.runner import EngineRunError
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.prober import Prober
from tools.scenario import from_dict

RELEASES = ("4.36.2", "4.40.2", "4.45.2", "4.48.3", "4.51.3", "4.52.4", "5.24.0")
ARCHS = ("llama", "qwen2", "mistral", "gemma2")
FIRST_RELEASE = {"llama": "4.0", "mistral": "4.34.0", "qwen2": "4.37.0", "gemma2": "4.42.0"}
# (release, arch) -> the upstream report of a difference from 5.24.0 that is that release's own bug
KNOWN_DIFFERENCES = {
    # eager sliding-window mask keeps W+1 keys (5.24: W): every position >= 32 differs at layer 0 attention
    ("4.40.2", "mistral"): "huggingface/transformers#29623",
    # decode past the window with left padding slices the sliding layers' mask from the wrong end
    # (`attention_mask.shape[-1] <= 1` never holds): only the padded request, only decode steps;
    # fixed in 4.48.2 by huggingface/transformers#35681 ("Fix mask slicing for models with HybridCache")
    ("4.45.2", "gemma2"): "huggingface/transformers#35681",
}


@pytest.fixture(scope="session")
def release_tree(tmp_path_factory):
    trees: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in trees:
            trees[version] = tmp_path_factory.mktemp(f"transformers-{version}")
            unpack_package(wheel_path("transformers", version), "transformers", trees[version])
        return trees[version]

    return get


def greedy_scenario(arch: str) -> dict:
    """Two requests of different lengths in one left-padded batch, greedy, fp32, eager attention; the
    longer one (46 tokens) passes the factory sliding window (32) of mistral and gemma2."""
    reqs = [
        {"prompt_ids": list(range(40, 80)), "max_tokens": 6, "sampling": {"ignore_eos": True}},
        {"prompt_ids": list(range(300, 309)), "max_tokens": 6, "sampling": {"ignore_eos": True}},
    ]
    return {
        "model": {"arch": arch, "seed": 0},
        "target": {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
        "workload": {"requests": reqs},
    }


def has_arch(version: str, arch: str) -> bool:
    from packaging.version import Version

    return Version(version) >= Version(FIRST_RELEASE[arch])


def check_cell(tree: Path, version: str, arch: str) -> None:
    result = Prober().probe(from_dict(greedy_scenario(arch)), tree)
    assert result.target.meta["source"].startswith(str(tree)), "the release under test was imported"
    if (version, arch) in KNOWN_DIFFERENCES:
        assert result.divergent_taps, (
            f"{version} {arch}: expected the known difference {KNOWN_DIFFERENCES[version, arch]}"
        )
        return
    assert result.divergent_taps == [], f"{version} {arch}: {result.summary}"
    assert not result.diverged and result.tokens == {}, result.summary


def test_factory_checkpoint_stays_5x_and_4x_reads_it_through_load_overrides():
    """Regression (commit f44b470, found by the full benchmark run): the legacy keys were written into the checkpoint, which hid a bug that reads
    the legacy top-level rope_theta (an engine must see the checkpoint 5.x writes)."""
    config = json.loads((ensure_checkpoint({"arch": "llama", "seed": 0}) / "config.json").read_text())
    assert "rope_theta" not in config and "torch_dtype" not in config
    assert release_compat_keys(config)["rope_theta"] == config["rope_parameters"]["rope_theta"]
    linear = {"dtype": "float32", "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}}
    assert release_compat_keys(linear) == {
        "torch_dtype": "float32",
        "rope_theta": 5e5,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0, "type": "linear"},
    }
    assert release_compat_keys({**linear, **release_compat_keys(linear)}) == {}


def test_installed_release_needs_no_era_dependencies():
    import transformers

    installed_tree = Path(transformers.__file__).resolve().parents[1]
    assert tree_version(installed_tree) == transformers.__version__
    assert missing_requirements(installed_tree) == []


def test_oldest_release_loads_the_factory_checkpoint_and_agrees(release_tree):
    tree = release_tree("4.36.2")
    assert any(r.startswith("tokenizers<0.19") for r in missing_requirements(tree))
    check_cell(tree, "4.36.2", "llama")


def test_an_old_release_reads_the_factory_tokenizer_for_a_text_prompt(release_tree):
    """The factory writes its tokenizer as 5.x does (class `TokenizersBackend`, which 4.x lacks); a 4.x release
    reads its tokenizer.json as a fast tokenizer, so a text prompt (the sweep's staggered workload has one) runs
    and agrees instead of failing the cell (from the releases whose `tokenizers` parses today's file, 0.20 on)."""
    sc = greedy_scenario("llama")
    sc["workload"]["requests"][1] = {"prompt": "Grüße, 東京の夜 🙂", "max_tokens": 4, "sampling": {"ignore_eos": True}}
    result = Prober().probe(from_dict(sc), release_tree("4.48.3"))
    assert result.target.meta["source"].startswith(str(release_tree("4.48.3")))
    assert not result.diverged, result.summary
    assert len(result.target.outputs[1].prompt_ids) > 4


def test_release_without_the_arch_is_an_engine_error(release_tree):
    with pytest.raises(EngineRunError, match=r"transformers 4.36.2 has no 'gemma2' architecture") as e:
        Prober().probe(from_dict(greedy_scenario("gemma2")), release_tree("4.36.2"))
    assert e.value.kind == "crash"  # what the bisection counts as a skip


def test_an_arch_the_release_lacks_is_refused_up_front_and_left_out_of_its_sweep(release_tree):
    """The adapter declares the release's own archs: preflight refuses gemma2 on 4.36.2 in one line (exit 2, not
    an engine failure), and the sweep's matrix leaves its gemma2 cells out with the reason."""
    from tools.errors import BadInput
    from tools.preflight import preflight
    from tools.scenario import EngineSpec
    from tools.sweep.matrix import Scope, default_matrix

    tree = release_tree("4.36.2")
    with pytest.raises(BadInput, match=r"\[model\] transformers has no gemma2 architecture \(the tree under test\)"):
        preflight(from_dict(greedy_scenario("gemma2")), tree)
    from agent.check import declared_axes

    features, variants, _, _, scope = declared_axes(EngineSpec(engine="transformers"), tree)
    assert isinstance(scope, Scope) and "llama" in (scope.caps.archs or ()) and "gemma2" not in (scope.caps.archs or ())
    matrix = default_matrix(features, variants)
    assert not any(c.arch == "gemma2" for c in matrix.cells(variants, features, scope))
    assert "gemma2: transformers has no gemma2 architecture" in matrix.left_out(scope, variants)


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("arch", ARCHS)
def test_release_matrix(release_tree, version, arch):
    if not has_arch(version, arch):
        pytest.skip(f"transformers {version} predates {arch}")
    check_cell(release_tree(version), version, arch)
