"""The probe on transformers: no false alarms, and exact localization of injected faults."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.faults import LATE_POSITION_OFFSET, MLP_DOWN_OFFSET, NORM_EPS, ROPE_BASE, write_fault
from tools.probe.prober import Prober
from tools.scenario import from_dict

WINDOW_CROSSING = list(range(3, 48))  # 45 tokens: past the tiny presets' sliding window of 32


def scenario(arch, dtype="float32", attn="eager", prompts=(WINDOW_CROSSING,), max_tokens=6):
    return from_dict(
        {
            "model": {"arch": arch, "seed": 0},
            "target": {"engine": "transformers", "dtype": dtype, "options": {"attn_implementation": attn}},
            "workload": {
                "requests": [
                    {"prompt_ids": list(p), "max_tokens": max_tokens, "sampling": {"ignore_eos": True}} for p in prompts
                ]
            },
        }
    )


NO_ALARM_CONFIGS = [
    (arch, dtype, attn)
    for arch in ("llama", "qwen2", "mistral", "gemma2")
    for dtype, attn in (("bfloat16", "sdpa"), ("float16", "eager"), ("float32", "sdpa"))
]


@pytest.mark.parametrize("arch,dtype,attn", NO_ALARM_CONFIGS)
def test_no_false_alarms_on_correct_targets(arch, dtype, attn):
    attn = "eager" if arch == "gemma2" else attn  # transformers 5.24 runs gemma2 eager only
    result = Prober().probe(scenario(arch, dtype, attn, prompts=(WINDOW_CROSSING, [7, 8, 9, 10, 11])))
    assert result.divergent_taps == [], result.summary
    assert not result.diverged, result.summary
    assert max(r for _, r in result.layers) < 2.0


@pytest.mark.parametrize("arch,layer", [("llama", 0), ("llama", 1), ("qwen2", 1)])
def test_offset_in_mlp_down_is_found_at_that_tap(tmp_path, arch, layer):
    src = write_fault(tmp_path / "tree", MLP_DOWN_OFFSET, arch, layer=layer, delta=0.01)
    result = Prober().probe(scenario(arch), target_source=src)
    assert result.first is not None
    assert result.first.tap == f"layers.{layer}.mlp.down"
    assert result.first.steps[0] == 0 and result.first.ratio > 100


def test_float32_reference_is_honoured(tmp_path):
    """Regression (issue 16): `[reference] dtype` was accepted and ignored (Y always ran in float64).
    Now it is the trusted run's precision: an fp32 target against an fp32 reference is two runs,
    and a real fault is still found at its tap."""
    src = write_fault(tmp_path / "tree", MLP_DOWN_OFFSET, "llama", layer=1, delta=0.01)
    sc = scenario("llama").with_reference(dtype="float32")
    prober = Prober()
    result = prober.probe(sc, target_source=src)
    assert [run["dtype"] for run in prober.runs] == ["float32", "float32"]
    assert result.engine_runs == 2 and result.first.tap == "layers.1.mlp.down"


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_wrong_norm_eps_is_found_at_that_norm(tmp_path, arch):
    src = write_fault(tmp_path / "tree", NORM_EPS, arch, layer=1, eps=0.5)
    result = Prober().probe(scenario(arch), target_source=src)
    expected = "mlp_norm" if arch == "mistral" else "attn.post_norm"  # gemma2 names its norms apart
    assert result.first.tap == f"layers.1.{expected}"


def test_wrong_rope_base_is_found_at_the_first_rotary_tap(tmp_path):
    src = write_fault(tmp_path / "tree", ROPE_BASE, "llama")
    result = Prober().probe(scenario("llama"), target_source=src)
    assert result.first.tap == "layers.0.attn.q_rot"
    assert result.first.positions[0] >= 1  # position 0 is not rotated by any base


def test_corruption_of_late_decode_positions_is_reported_with_them(tmp_path):
    prompt = list(range(3, 23))  # 20 prompt tokens, decode from position 20 on
    src = write_fault(tmp_path / "tree", LATE_POSITION_OFFSET, "llama", layer=1, start=23, delta=0.05)
    result = Prober().probe(scenario("llama", prompts=(prompt,), max_tokens=8), target_source=src)
    assert result.first.tap == "layers.1.out"
    assert result.first.positions == list(range(23, 27))
    assert min(result.first.steps) >= 1  # decode steps only: prefill is step 0


def test_probe_cli_exit_codes(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text(
        '[model]\narch = "llama"\n[target]\nengine = "transformers"\ndtype = "float32"\n'
        "[[workload.requests]]\nprompt_ids = [1, 5, 9, 13]\nmax_tokens = 3\n"
        "sampling = { ignore_eos = true }\n"
    )
    ok = subprocess.run(
        [sys.executable, "-m", "tools.probe.prober", "--scenario", str(toml), "--json"], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["diverged"] is False
    src = write_fault(tmp_path / "tree", MLP_DOWN_OFFSET, "llama", layer=0, delta=0.01)
    (src / "transformers").mkdir()  # the CLI wants the engine's package in the tree; an empty folder is
    #                                  only a namespace portion, so the installed transformers still loads
    bad = subprocess.run(
        [sys.executable, "-m", "tools.probe.prober", "--scenario", str(toml), "--target-source", str(src)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "layers.0.mlp.down" in bad.stdout
    (tmp_path / "broken.toml").write_text("[model]\narch = 'llama'\n")
    err = subprocess.run(
        [sys.executable, "-m", "tools.probe.prober", "--scenario", str(tmp_path / "broken.toml")],
        capture_output=True,
        text=True,
    )
    assert err.returncode == 2 and "target" in err.stderr
