"""The sweep axes the transformers adapter declares: SDPA attention (a feature), YaRN over a pretraining
length below max_position_embeddings and trained-scale weights (config variants). What the default
matrix then holds, what each cell's scenario carries, and real tiny runs of the installed transformers
against the reference: the new cells agree on the bug-free package."""

from __future__ import annotations

import pytest

from agent.check import declared_axes
from tools.engines.hf import HFEngine
from tools.probe.checkpoints import TINY_PRESETS
from tools.probe.prober import Prober
from tools.scenario import EngineSpec
from tools.sweep.matrix import Cell, default_matrix, scenario_of

TARGET = EngineSpec("transformers", "float32", {})
REFERENCE = {"engine": "refmodel"}


@pytest.fixture(scope="module")
def axes():
    return declared_axes(TARGET, None)


def test_the_adapter_declares_sdpa_yarn_and_trained_scale(axes):
    features, variants, _, sampling_keys, scope = axes
    assert features["sdpa"].options == {"attn_implementation": "sdpa"}
    yarn = variants["rope_yarn"].model["rope_scaling"]
    # a pretraining length below every preset's max_position_embeddings: reading the one for the other shows
    assert all(yarn["original_max_position_embeddings"] < p["max_position_embeddings"] for p in TINY_PRESETS.values())
    assert variants["trained_scale"].model == {"initializer_range": 0.2}
    assert sampling_keys == HFEngine().capabilities().sampling_keys
    # qwen2 with its window switched on, mistral and gemma2 at a window off every power of two
    assert variants["window_20"].archs == ("mistral", "gemma2", "qwen2")
    assert variants["window_20"].model_for("qwen2")["use_sliding_window"] is True
    assert {"llama", "qwen2", "mistral", "gemma2"} <= set(scope.caps.archs or ())  # the installed release runs them all


def test_trained_scale_meets_every_arch_precision_and_prompt_shape(axes):
    """A rounding in one arch's own modeling code shows in one precision at a long prompt's positions:
    every (arch, dtype, workload) triple holds a trained-scale cell; the other variants keep their pairs."""
    features, variants, _, _, _ = axes
    m = default_matrix(features, variants)
    cells = m.cells(variants, features)
    met = {(c.arch, c.dtype, c.workload) for c in cells if c.config == "trained_scale"}
    assert ("qwen2", "bfloat16", "long") in met and len(met) == len(m.arch) * len(m.dtype) * len(m.workload)
    assert {(c.dtype, c.workload) for c in cells if c.config == "rope_yarn"} == {
        (d, w) for d in m.dtype for w in m.workload
    }
    assert {c.features for c in cells} == {"none", "sdpa"}
    # transformers 5 refuses sdpa for gemma2: the matrix holds no such cell, every other arch meets it
    assert {c.arch for c in cells if c.features == "sdpa"} == set(m.arch) - {"gemma2"}


def test_an_sdpa_cell_batches_prompts_of_different_lengths_with_equal_settings(axes):
    """transformers batches requests with equal sampling and length (left-padded): the long and the
    staggered workloads give SDPA a padded batch."""
    features, variants, _, keys, _ = axes
    for workload in ("long", "staggered"):
        sc = scenario_of(Cell("llama", "float32", "sdpa", workload), TARGET, features, REFERENCE, variants, keys)
        assert sc.target.options["attn_implementation"] == "sdpa"
        groups: dict = {}
        for r in sc.requests:
            groups.setdefault(repr((sorted(r.sampling.items()), r.max_tokens)), set()).add(len(r.prompt_ids or []))
        assert any(len(lengths) > 1 for lengths in groups.values()), workload


@pytest.mark.slow
@pytest.mark.parametrize(
    "cell",
    [
        Cell("llama", "float32", "sdpa", "long"),
        Cell("llama", "float32", "none", "staggered", "rope_yarn"),
        Cell("qwen2", "bfloat16", "none", "long", "trained_scale"),
        Cell("llama", "float32", "none", "sampled"),
    ],
    ids=lambda c: c.id,
)
def test_the_new_cells_agree_on_the_installed_transformers(axes, cell):
    features, variants, _, keys, _ = axes
    sc = scenario_of(cell, TARGET, features, REFERENCE, variants, keys)
    result = Prober().probe(sc, None)
    assert not result.diverged, result.summary
