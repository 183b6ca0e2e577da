"""Tensor replacement: the reference's rows injected at a tap of the target split faults apart.

End to end on faulty copies of tinyserve (real git trees, one-line patches) and on transformers
with a sitecustomize fault; the adapters' injection paths checked in-process on real models.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.faults import MLP_DOWN_OFFSET, NORM_EPS, write_fault, write_faults
from tests.faults_tinyserve import ATTN_SCALE, MLP_NORM_EPS, faulty_tree
from tools.engines.hf import HFEngine
from tools.engines.injection import Injection, splice_rows
from tools.engines.protocol import RunJob
from tools.engines.tinyserve import TinyServeEngine
from tools.probe import compare
from tools.probe import trace as trace_io
from tools.probe.align import index
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.prober import Prober, ProbeResult
from tools.probe.replace import (
    DOWNSTREAM,
    NO_VERDICT,
    UPSTREAM,
    Replacement,
    Replacer,
    check_replaceable,
    downstream_divergence,
    rows_at,
)
from tools.probe.trace import TapRecord, Trace
from tools.scenario import from_dict

PROMPTS = (list(range(3, 23)), [7, 8, 9, 10, 11])
TEACHER = [p + [40, 41, 42, 43] for p in PROMPTS]  # teacher-forced: both runs see these tokens
slow = pytest.mark.slow


def scenario(arch: str, engine: str = "tinyserve"):
    return from_dict(
        {
            "model": {"arch": arch, "seed": 0},
            "target": {"engine": engine, "dtype": "float32"},
            "workload": {
                "requests": [{"prompt_ids": p, "max_tokens": 4, "sampling": {"ignore_eos": True}} for p in PROMPTS]
            },
        }
    )


def replacer(arch: str, source: Path, engine: str = "tinyserve") -> Replacer:
    sc, prober = scenario(arch, engine), Prober()
    return Replacer(sc, prober.run_reference(sc, sc.reference.dtype, TEACHER, None), source, prober)


@pytest.mark.parametrize(
    "arch",
    [
        "llama",
        pytest.param("qwen2", marks=slow),
        pytest.param("mistral", marks=slow),
        pytest.param("gemma2", marks=slow),
    ],
)
def test_injecting_at_the_first_divergent_tap_removes_a_single_fault(arch, tmp_path):
    split = replacer(arch, faulty_tree(tmp_path / "repo", [(ATTN_SCALE, 1)]))
    first = split.control().first
    assert first.tap == "layers.1.attn.out"
    at = split.at(first.tap)
    assert at.verdict == UPSTREAM and at.after is None
    assert at.replaced.divergent_taps == []
    assert at.injected_rows == {first.tap: sum(len(t) - 1 for t in TEACHER)}  # the last token is never fed
    before = split.at("layers.0.out")  # the residual stream, before the faulty layer
    assert before.verdict == DOWNSTREAM
    assert before.after.tap == first.tap


@pytest.mark.parametrize(
    "arch",
    [
        "llama",
        pytest.param("qwen2", marks=slow),
        pytest.param("mistral", marks=slow),
        pytest.param("gemma2", marks=slow),
    ],
)
def test_two_faults_in_two_layers_are_split(arch, tmp_path):
    split = replacer(arch, faulty_tree(tmp_path / "repo", [(ATTN_SCALE, 0), (MLP_NORM_EPS[arch], 1)]))
    first = split.control().first
    assert first.tap == "layers.0.attn.out"
    one = split.at(first.tap)
    assert one.verdict == DOWNSTREAM
    assert one.after.tap == "layers.1.mlp_norm"  # the second fault, hidden behind the first
    both = split.at([first.tap, one.after.tap])
    assert both.verdict == UPSTREAM and both.replaced.divergent_taps == []


# Both adapters inject on every arch. transformers injects in its teacher-forced forward (one
# forward over the whole sequence, as every replacement run is): not inside `generate`, and not
# at logits / sampler taps, which it computes outside the hooked modules.
HF_MLP_NORM_TAP = {"llama": "mlp_norm", "qwen2": "mlp_norm", "mistral": "mlp_norm", "gemma2": "attn.post_norm"}


@pytest.mark.parametrize("arch", [pytest.param(a, marks=slow) for a in ("qwen2", "mistral", "gemma2")])
def test_transformers_injection_removes_a_single_fault_on_every_arch(arch, tmp_path):
    split = replacer(arch, write_fault(tmp_path / "tree", MLP_DOWN_OFFSET, arch, layer=1, delta=0.01), "transformers")
    first = split.control().first
    assert first.tap == "layers.1.mlp.down"
    at = split.at(first.tap)
    assert at.verdict == UPSTREAM and at.replaced.divergent_taps == []
    assert split.at("layers.0.out").after.tap == first.tap  # injecting upstream of it leaves it


@slow
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_transformers_two_faults_in_two_layers_are_split(arch, tmp_path):
    faults = [(MLP_DOWN_OFFSET, {"layer": 0, "delta": 0.01}), (NORM_EPS, {"layer": 1, "eps": 0.5})]
    split = replacer(arch, write_faults(tmp_path / "tree", faults, arch), "transformers")
    first = split.control().first
    assert first.tap == "layers.0.mlp.down"
    one = split.at(first.tap)
    assert one.verdict == DOWNSTREAM
    assert one.after.tap == f"layers.1.{HF_MLP_NORM_TAP[arch]}"  # the second fault, hidden behind the first
    both = split.at([first.tap, one.after.tap])
    assert both.verdict == UPSTREAM and both.replaced.divergent_taps == []


@slow
def test_transformers_target_is_split_and_the_cli_says_so(tmp_path):
    src = write_fault(tmp_path / "tree", MLP_DOWN_OFFSET, "llama", layer=1, delta=0.01)
    split = replacer("llama", src, "transformers")
    assert split.control().first.tap == "layers.1.mlp.down"
    assert split.at("layers.1.mlp.down").verdict == UPSTREAM
    assert split.at("layers.1.mlp.act").after.tap == "layers.1.mlp.down"
    toml = tmp_path / "s.toml"
    toml.write_text(
        '[model]\narch = "llama"\n[target]\nengine = "transformers"\n[[workload.requests]]\n'
        "prompt_ids = [3, 4, 5, 6, 7, 8, 9, 10]\nmax_tokens = 3\nsampling = { ignore_eos = true }\n"
    )
    cli = [sys.executable, "-m", "tools.probe.replace", "--scenario", str(toml), "--target-source", str(src)]
    fixed = subprocess.run(cli + ["--tap", "layers.1.mlp.down"], capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stderr
    assert "at or before layers.1.mlp.down" in fixed.stdout
    stays = subprocess.run(cli + ["--tap", "layers.1.mlp.act", "--json"], capture_output=True, text=True)
    assert stays.returncode == 1, stays.stderr
    assert '"verdict": "downstream"' in stays.stdout


# ---- the adapters' injection, in-process on real tiny models ----------------------------------


def run_in_process(engine, sc, tmp_path: Path, inject: Trace | None = None) -> Trace:
    path = str(trace_io.save(inject, tmp_path / f"inject{len(list(tmp_path.iterdir()))}")) if inject else None
    job = RunJob(sc, sc.target, str(ensure_checkpoint(sc.model)), teacher=TEACHER, replace=path)
    return engine.run(job)


def scaled(trace: Trace, tap: str, factor: float) -> Trace:
    recs = [
        TapRecord(r.name, r.step, r.request, r.positions, r.tensor * factor) for r in trace.records if r.name == tap
    ]
    return Trace(trace.engine, trace.dtype, trace.outputs, recs)


def rows(trace: Trace, tap: str, request: int = 0) -> torch.Tensor:
    return index(trace)[(tap, request)].tensor


# engine, arch, taps injected with the target's own rows (nothing may change), and a tap whose
# rows are flipped: the norm read right after it flips too (RMSNorm(-x) = -RMSNorm(x)), so the
# model read the injected rows; a tap before it stays as it was.
INJECTION_CASES = [
    (
        TinyServeEngine(),
        "llama",
        ["layers.0.out", "layers.0.attn.k", "layers.1.attn.k_rot", "layers.1.mlp.act", "logits"],
        ("layers.0.out", "layers.1.attn_norm", "layers.0.mlp.down"),
    ),
    (
        TinyServeEngine(),
        "gemma2",
        ["embed", "layers.0.resid_mid", "layers.1.attn_norm", "sampler.logits"],
        ("layers.0.resid_mid", "layers.0.mlp_norm", "layers.0.attn.post_norm"),
    ),
    (
        HFEngine(),
        "llama",
        ["layers.0.out", "layers.1.attn.out", "layers.1.attn.k_rot", "layers.0.mlp.act"],
        ("layers.0.out", "layers.1.attn_norm", "layers.0.mlp.down"),
    ),
    (
        HFEngine(),
        "gemma2",
        ["embed", "layers.0.attn.post_norm", "layers.1.attn.q_rot"],
        ("embed", "layers.0.attn_norm", None),
    ),
]


@pytest.mark.parametrize(
    "engine,arch,identity,flip", INJECTION_CASES, ids=[f"{c[0].name}-{c[1]}" for c in INJECTION_CASES]
)
def test_injection_writes_the_rows_back_where_the_model_reads_them(engine, arch, identity, flip, tmp_path):
    sc = scenario(arch, engine.name)
    base = run_in_process(engine, sc, tmp_path)
    same = run_in_process(engine, sc, tmp_path, rows_at(base, identity))
    assert set(same.meta["replaced_rows"]) == set(identity) and all(same.meta["replaced_rows"].values())
    for key, r in index(base).items():
        assert torch.equal(index(same)[key].tensor, r.tensor), key
    tap, norm_after, before = flip
    flipped = run_in_process(engine, sc, tmp_path, scaled(base, tap, -1.0))
    assert torch.equal(rows(flipped, tap), -rows(base, tap))
    torch.testing.assert_close(rows(flipped, norm_after), -rows(base, norm_after), rtol=1e-4, atol=1e-5)
    if before:
        assert torch.equal(rows(flipped, before), rows(base, before))


# ---- pure parts ---------------------------------------------------------------------------------


def test_rows_are_matched_by_request_and_position_and_cast():
    ref = Trace(
        "transformers", "float64", [], [TapRecord("layers.0.out", 0, 1, [2, 3], torch.ones(2, 4, dtype=torch.float64))]
    )
    inject = Injection(ref)
    x = torch.zeros(4, 2, 2, dtype=torch.bfloat16)  # rows: (0, 2), (1, 2), (1, 3), (1, 9)
    out = inject.apply("layers.0.out", x, [0, 1, 1, 1], [2, 2, 3, 9])
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert out.reshape(4, -1).sum(-1).tolist() == [0.0, 4.0, 4.0, 0.0]
    assert inject.replaced == {"layers.0.out": 2}
    assert x.abs().sum() == 0  # the input is not modified in place
    with pytest.raises(ValueError, match="4 features, the target computes 3"):
        splice_rows(torch.zeros(1, 3), {0: torch.ones(4)})


def stat(tap: str, ratio: float) -> compare.TapStat:
    return compare.summarize(tap, 0, [0, 1], [0, 0], torch.tensor([ratio, ratio]))


def probed(stats) -> ProbeResult:
    return ProbeResult(
        "float32", compare.first_divergence(stats), {}, [], compare.divergent_taps(stats), 1, stats=stats
    )


def test_only_divergence_after_the_injection_point_counts():
    stats = [
        stat("layers.0.attn.out", 50.0),
        stat("layers.0.out", 1.0),
        stat("layers.1.mlp.down", 30.0),
        stat("layers.1.out", 30.0),
        stat("logits", 30.0),
    ]
    assert downstream_divergence(stats, ["layers.0.out"]).tap == "layers.1.mlp.down"
    assert downstream_divergence(stats[:2], ["layers.0.out"]) is None


def test_a_divergence_that_flows_around_a_branch_tap_gives_no_verdict():
    """Fault in layer 0's attention, reference injected at layer 1's MLP output: the residual stream
    still carries layer 0's error past it, which says nothing about a fault after the tap."""
    stats = [
        stat("layers.0.attn.out", 50.0),
        stat("layers.0.out", 20.0),
        stat("layers.1.mlp.down", 1.0),
        stat("layers.1.out", 20.0),
        stat("logits", 20.0),
    ]
    branch = Replacement(["layers.1.mlp.down"], probed(stats), probed(stats), {"layers.1.mlp.down": 2})
    assert branch.verdict == NO_VERDICT and branch.bypass.tap == "layers.0.attn.out"
    assert "reaches past it" in branch.summary
    stream = Replacement(["layers.1.resid_mid"], probed(stats), probed(stats), {"layers.1.resid_mid": 2})
    assert stream.verdict == DOWNSTREAM and stream.bypass is None


def test_taps_an_adapter_cannot_replace_are_refused():
    with pytest.raises(ValueError, match="cannot inject at \\['layers.0.resid_mid'\\]"):
        check_replaceable(scenario("llama", "transformers"), ["layers.0.resid_mid"])
    with pytest.raises(ValueError, match="sampler.probs"):
        check_replaceable(scenario("llama"), ["sampler.probs"])
    with pytest.raises(ValueError, match="no rows at \\['logits'\\]"):
        rows_at(Trace("transformers", "float64", []), ["logits"])
