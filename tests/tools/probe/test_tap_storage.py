"""What the capture keeps (issue 14, probe cost): vocabulary-wide head taps as wide as the run (float32
unless the run is float64), and the same verdicts as when they were all kept in float64; the top-k
bounds found without sorting the vocabulary equal their counting definition."""

from __future__ import annotations

import torch

from tools.probe import taps as tapnames
from tools.probe.prober import Prober, compare_traces
from tools.probe.sampling_ref import top_k_bounds
from tools.probe.trace import TapRecord, Trace
from tools.scenario import from_dict

PROMPTS = (list(range(3, 20)), [7, 8, 9, 10, 11])
SAMPLINGS = ({"ignore_eos": True}, {"ignore_eos": True, "temperature": 0.8, "top_p": 0.9, "min_p": 0.05, "seed": 3})


def scenario(dtype: str):
    requests = [{"prompt_ids": p, "max_tokens": 5, "sampling": s} for p, s in zip(PROMPTS, SAMPLINGS, strict=True)]
    return from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "transformers", "dtype": dtype, "options": {"attn_implementation": "sdpa"}},
            "workload": {"requests": requests},
        }
    )


def widened(trace: Trace) -> Trace:
    """The trace with its head taps in float64, as the capture kept them before."""
    records = [
        TapRecord(r.name, r.step, r.request, r.positions, r.tensor.double(), r.rank)
        if r.name in tapnames.HEAD_TAPS
        else r
        for r in trace.records
    ]
    return Trace(trace.engine, trace.dtype, trace.outputs, records, trace.meta)


def head_dtypes(trace: Trace) -> set[torch.dtype]:
    return {r.tensor.dtype for r in trace.records if r.name in tapnames.HEAD_TAPS and r.name != "sampler.token"}


def test_head_taps_are_kept_as_wide_as_the_run_and_judge_as_in_float64():
    sc = scenario("bfloat16")
    prober = Prober()
    target = prober.run_target(sc, None)
    high = prober.run_reference(sc, sc.reference.dtype, target.sequences(), None)
    low = prober.run_reference(sc, sc.target.dtype, target.sequences(), None)
    assert head_dtypes(target) == head_dtypes(low) == {torch.float32}
    assert head_dtypes(high) == {torch.float64}
    kept, wide = compare_traces(sc, target, low, high), compare_traces(sc, *(widened(t) for t in (target, low, high)))
    assert kept.to_dict() == wide.to_dict()
    assert {s.tap for s in kept.stats} >= {"logits", "sampler.logits", "sampler.probs", "sampler.token"}
    for a, b in zip(kept.stats, wide.stats, strict=True):
        assert (a.tap, a.request, a.rows, a.first_step) == (b.tap, b.request, b.rows, b.first_step)
        assert (a.over_positions, a.over_steps, a.nonfinite) == (b.over_positions, b.over_steps, b.nonfinite)
        # float32 rounding of rows derived in float64 (~1e-7 relative) against floors of 2e-5 and more
        assert abs(a.max_ratio - b.max_ratio) <= 1e-3 * (1 + b.max_ratio), a.tap


def counted_top_k_bounds(x: torch.Tensor, k: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition: kept iff fewer than k others lie strictly above (others perhaps / surely above)."""
    others = ~torch.eye(len(x), dtype=torch.bool)
    maybe_above = ((x[None, :] > x[:, None] - 2 * eps) & others).sum(1)
    surely_above = ((x[None, :] > x[:, None] + 2 * eps) & others).sum(1)
    return maybe_above < k, surely_above < k


def test_top_k_bounds_match_their_counting_definition_with_ties():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        x = torch.randint(0, 12, (40,), generator=g).double() * 0.25  # many ties, and values 2eps apart
        k = int(torch.randint(1, 40, (1,), generator=g))
        for eps in (0.0, 0.125, 0.3):
            sure, maybe = top_k_bounds(x, k, eps)
            want_sure, want_maybe = counted_top_k_bounds(x, k, eps)
            assert torch.equal(sure, want_sure) and torch.equal(maybe, want_maybe), (trial, k, eps)
