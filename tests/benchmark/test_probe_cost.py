"""benchmark/probe_cost.py: plain and probe arms on the tiny default scenario, and `--old-tree`, which
times another diffdx tree's compare on the probe arm's own traces (real engine runs, a real subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmark import probe_cost

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_an_old_tree_s_compare_is_timed_on_the_same_traces(capsys, tmp_path):
    assert probe_cost.main(["--repeats", "1", "--no-warmup", "--old-tree", str(ROOT)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["old_verdicts"] == out["verdicts"]  # the same tree: the same verdict on the same traces
    assert out["old_probe_median_s"] > 0 and out["plain_median_s"] > 0 and out["old_ratio"] > 0
    assert len(out["load_average_at_round_start"]) == 1


def test_the_old_compare_reads_the_kept_traces_of_another_tree(tmp_path):
    """`old_compare` on traces saved by hand: the subprocess loads them and reports a verdict."""
    import torch

    from tools.probe import trace as trace_io
    from tools.probe.trace import RequestOutput, TapRecord, Trace

    traces = {}
    for name, noise in (("target", 1e-3), ("low", 1e-3), ("high", 0.0)):
        g = torch.Generator().manual_seed(len(name))
        x = torch.ones(3, 8) + noise * torch.randn(3, 8, generator=g)
        out = [RequestOutput(prompt_ids=[1, 2, 3], output_ids=[], text=None)]
        trace = Trace("toy", "bfloat16", out, records=[TapRecord("layers.0.out", 0, 0, [0, 1, 2], x)])
        trace_io.save(trace, tmp_path / name / "trace")
        traces[name] = Trace("toy", "bfloat16", out, meta={"run_dir": str(tmp_path / name)})
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        '[model]\narch = "llama"\n[target]\nengine = "tinyserve"\ndtype = "bfloat16"\n'
        "[[workload.requests]]\nprompt_ids = [1, 2, 3]\nmax_tokens = 1\n"
    )
    old = {"tree": str(ROOT), "smollm2": False, "requests": 0, "tokens": 0, "scenario": str(scenario)}
    got = probe_cost.old_compare(old, traces)
    assert got["verdict"].startswith("agree") and got["compare_s"] >= 0
