"""The divergence plot: titled with the issue, target, dtype and trigger; layers banded; big models legible."""

import torch

from tools.probe.compare import Divergence, summarize
from tools.probe.prober import ProbeResult
from tools.probe.taps import LAYER_TAPS
from tools.report import layer_bands, plot_divergence, plot_title


def stat(tap, ratio):
    return summarize(tap, 0, [0, 1], [0, 0], torch.tensor([1.0, ratio], dtype=torch.float64))


def model_stats(layers: int, bad_layer: int):
    taps = ["embed"] + [f"layers.{i}.{t}" for i in range(layers) for t in LAYER_TAPS] + ["final_norm", "logits"]
    bad = taps.index(f"layers.{bad_layer}.mlp.act")
    return [stat(t, 300.0 if i >= bad else 1.1) for i, t in enumerate(taps)]


def test_title_names_issue_target_dtype_trigger_and_first_divergence():
    first = Divergence("layers.1.mlp.act", 0, [0], [3], [0], 412.0)
    probe = ProbeResult("bfloat16", first, {}, [], [], 3)
    title = plot_title({"issue": "1201", "trigger": "a batch of 4 requests"}, probe)
    assert title.startswith("Issue 1201: target bfloat16")
    assert "trigger: a batch of 4 requests" in title and "layers.1.mlp.act (ratio 412)" in title
    assert "the scenario as given" in plot_title({"issue": "7", "trigger": ""}, probe)


def test_layer_bands_follow_runs_of_one_layer():
    taps = ["embed", "layers.0.attn_norm", "layers.0.out", "layers.1.attn_norm", "final_norm"]
    assert layer_bands(taps) == [(0, 1, 2), (1, 3, 3)]


def test_plots_small_and_large_models(tmp_path):
    for layers in (2, 40):  # tap labels for a small model, layer labels for a 40-layer one
        path = tmp_path / f"divergence-{layers}.png"
        assert plot_divergence(model_stats(layers, 1), path, [0], "layers.1.mlp.act", title=f"Issue 1: {layers}")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plot_divergence([], tmp_path / "none.png")
