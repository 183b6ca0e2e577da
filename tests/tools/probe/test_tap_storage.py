"""What the capture keeps (issue 14, probe cost): taps in the dtype they were computed in, rows no wider
than the compare needs (float32 against a 16-bit target), and the same verdicts as with every row in
float64; the top-k bounds found without sorting the vocabulary equal their counting definition."""

from __future__ import annotations

import torch

from tools.engines.protocol import RunJob
from tools.engines.runner import run_engine
from tools.probe import taps as tapnames
from tools.probe.checkpoints import reference_checkpoint
from tools.probe.compare import SAMPLING_JUDGED, stored_precision
from tools.probe.prober import Prober, compare_traces, reference_taps
from tools.probe.sampling_ref import top_k_bounds
from tools.probe.trace import TapRecord, Trace
from tools.scenario import EngineSpec, from_dict

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
    """The trace with every row in float64, as the capture once kept a float64 run's (and wider than it
    kept a 16-bit run's: float32)."""
    records = [TapRecord(r.name, r.step, r.request, r.positions, r.tensor.double(), r.rank) for r in trace.records]
    return Trace(trace.engine, trace.dtype, trace.outputs, records, trace.meta)


def dtypes(trace: Trace, head: bool) -> set[torch.dtype]:
    """The dtypes of its vocabulary-wide head taps (`head`) or of its other taps."""
    vocabulary = set(tapnames.HEAD_TAPS) - {"sampler.token"}
    return {r.tensor.dtype for r in trace.records if (r.name in vocabulary) == head and r.name != "sampler.token"}


def test_taps_are_kept_as_computed_or_as_wide_as_the_compare_needs_and_judge_as_in_float64():
    """Issue 14, probe cost: a bf16 run's layer taps are kept in bf16 (not upcast at capture), the
    float64 reference's rows in float32 (`stored_precision`), rows derived in float64 from a bf16 run
    (the sampler's probabilities) in float32; the verdict is the one of every row in float64."""
    sc = scenario("bfloat16")
    prober = Prober()
    target = prober.run_target(sc, None)
    high = prober.run_reference(sc, sc.reference.dtype, target.sequences(), None)
    low = prober.run_reference(sc, sc.target.dtype, target.sequences(), None)
    assert dtypes(target, head=False) == dtypes(low, head=False) == {torch.bfloat16}
    # raw logits as computed; the sampler's rows (generate's float32 scores, rows derived in float64) float32
    assert dtypes(target, head=True) == dtypes(low, head=True) == {torch.bfloat16, torch.float32}
    assert dtypes(high, head=False) == dtypes(high, head=True) == {torch.float32}
    kept, wide = compare_traces(sc, target, low, high), compare_traces(sc, *(widened(t) for t in (target, low, high)))
    assert kept.to_dict() == wide.to_dict()
    assert {s.tap for s in kept.stats} >= {"logits", "sampler.logits", "sampler.probs", "sampler.token"}
    for a, b in zip(kept.stats, wide.stats, strict=True):
        assert (a.tap, a.request, a.rows, a.first_step) == (b.tap, b.request, b.rows, b.first_step)
        assert (a.over_positions, a.over_steps, a.nonfinite) == (b.over_positions, b.over_steps, b.nonfinite)
        assert a.max_ratio == b.max_ratio, a.tap  # the same rows: widening to float64 changes no digit


def test_a_float32_compare_keeps_the_float64_reference_whole():
    """Against a float32 target, float32 rounding of the reference (6e-8) would be 1/300 of the floor:
    the float64 rows are kept as they are."""
    sc = scenario("float32")
    prober = Prober()
    target = prober.run_target(sc, None)
    high = prober.run_reference(sc, sc.reference.dtype, target.sequences(), None)
    assert dtypes(high, head=False) == {torch.float64}
    assert stored_precision("bfloat16") == stored_precision("float16") == torch.float32
    assert stored_precision("float32") == stored_precision("float64") == torch.float64


def test_references_capture_no_sampling_judged_taps_and_judge_as_with_them():
    """Issue 14, probe cost: `sampler.probs` and `sampler.token` are judged on the target's rows against the
    reference sampler's bounds on the sampler input, never on a reference's own rows, so the references do
    not capture them (a tenth of a real model's trace bytes); the verdict and every stat equal those
    against references that captured every tap, on a greedy and a sampled request."""
    sc = scenario("bfloat16")
    prober = Prober()
    target = prober.run_target(sc, None)
    teacher = target.sequences()
    precisions = (sc.reference.dtype, sc.target.dtype)
    high, low = (prober.run_reference(sc, d, teacher, None) for d in precisions)
    every_tap = [
        run_engine(
            RunJob(
                sc,
                EngineSpec(sc.reference.engine, d, sc.reference.options),
                str(reference_checkpoint(sc.model)),
                teacher=teacher,
                taps=None,
            )
        )
        for d in precisions
    ]
    for trace in (high, low):
        assert not set(trace.taps()) & set(SAMPLING_JUDGED) and "sampler.logits" in trace.taps()
    for trace in every_tap:
        assert set(SAMPLING_JUDGED) <= set(trace.taps())
    kept, whole = compare_traces(sc, target, low, high), compare_traces(sc, target, every_tap[1], every_tap[0])
    assert {"sampler.probs", "sampler.token"} <= {s.tap for s in kept.stats}
    assert kept.to_dict() == whole.to_dict() and kept.stats == whole.stats


def test_reference_taps_are_the_asked_ones_less_the_sampling_judged():
    every = reference_taps(None)
    assert every is not None and "layers.*" in every and "sampler.logits" in every
    assert not any(tapnames.matches(t, every) for t in SAMPLING_JUDGED)
    assert all(tapnames.matches(t, every) for t in ("embed", "layers.3.mlp.act", "final_norm", "logits"))
    assert reference_taps(["logits", "sampler.probs", "sampler.token"]) == ["logits"]
    assert reference_taps([]) == []


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
