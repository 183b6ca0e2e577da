"""Ablation switches (benchmark/ablations.py) and how benchmark.run takes them."""

from pathlib import Path

import pytest

from benchmark.ablations import AblatedStages, OutputTapsProber, output_taps, parse_ablations
from benchmark.cases import load_cases
from benchmark.run import ABLATED_AGENT, RunConfig, make_jobs, parse_args
from tools.probe.prober import Prober


def test_ablation_names_are_checked_and_normalised():
    assert parse_ablations(" taps,bisect,taps ") == ("bisect", "taps")
    with pytest.raises(ValueError, match="known: taps, drilldown, coverage, bisect"):
        parse_ablations("taps,llm")


def test_without_taps_every_probe_reads_the_output_only_but_coverage_runs_stay_bare():
    assert output_taps(None) == ["logits", "sampler.*"]
    assert output_taps(["layers.*"]) == ["logits", "sampler.*"]
    assert output_taps([]) == []
    inner = Prober()
    wrapped = AblatedStages(("taps",))._prober(inner)
    assert isinstance(wrapped, OutputTapsProber) and wrapped.engine_runs == 0  # counts on the real prober
    assert AblatedStages(("bisect",))._prober(inner) is inner


def test_benchmark_run_records_ablations_and_sends_them_in_each_diagnosis_config(tmp_path: Path):
    args = parse_args(["--ablate", "coverage,taps", "--out", str(tmp_path)])
    cfg = RunConfig(out=tmp_path, ablate=tuple(args.ablate.split(",")))
    with pytest.raises(ValueError, match="not of agent 'bisect-only'"):
        RunConfig(out=tmp_path, agent="bisect-only", ablate=("taps",))
    with pytest.raises(ValueError, match="unknown ablation"):
        RunConfig(out=tmp_path, ablate=("everything",))

    (job,) = make_jobs(load_cases(None, ["ts-prefix-hash-chain"]), cfg)
    assert job.agent == ABLATED_AGENT and job.config.ablate == ("coverage", "taps")
