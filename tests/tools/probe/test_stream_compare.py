"""The streaming compare (issue 14): traces read lazily, one tap at a time, give exactly the eager result."""

from __future__ import annotations

import pytest
import torch

from tests.faults import MIN_P_HALVED, buggy_tinyserve
from tools.probe import trace as trace_io
from tools.probe.prober import Prober, compare_traces
from tools.probe.trace import RequestOutput, TapRecord, Trace
from tools.scenario import from_dict


def test_lazy_records_read_back_every_dtype_and_shape(tmp_path):
    tensors = [
        torch.randn(3, 5, dtype=torch.float64),
        torch.randn(2, 4).to(torch.bfloat16),
        torch.randn(1, 7, dtype=torch.float16),
        torch.tensor([[4], [9]], dtype=torch.int64),
        torch.tensor([[True, False, True]]),
        torch.zeros(0, 6),
    ]
    records = [TapRecord(f"t{i}", i, 0, list(range(len(x))), x) for i, x in enumerate(tensors)]
    trace_io.save(Trace("e", "bfloat16", [RequestOutput([1], [2])], records), tmp_path)
    lazy = trace_io.load(tmp_path, lazy=True)
    for i, (rec, x) in enumerate(zip(lazy.records, tensors, strict=True)):
        assert rec.tensor.dtype == x.dtype and torch.equal(rec.tensor, x)
        assert (rec.name, rec.step, rec.positions) == (f"t{i}", i, list(range(len(x))))
    assert lazy.records[0].tensor is not lazy.records[0].tensor  # read anew each time: nothing is kept


def scenario():
    """A batch on the bundled tinyserve (chunked prefill: rows of one tap over several steps), one
    greedy and two sampled requests, so layer, logit, sampler and token comparisons all run."""
    sampled = {"temperature": 0.8, "min_p": 0.6, "ignore_eos": True}
    prompts = [[5, 17, 42, 99, 260, 301, 7, 8, 9, 10, 11], list(range(40, 58)), list(range(100, 121))]
    samplings = [{**sampled, "seed": 11}, {**sampled, "seed": 12}, {"ignore_eos": True}]
    return from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {
                "engine": "tinyserve",
                "dtype": "bfloat16",
                "options": {"enable_chunked_prefill": True, "max_num_batched_tokens": 16},
            },
            "workload": {
                "requests": [
                    {"prompt_ids": p, "max_tokens": 8, "sampling": s} for p, s in zip(prompts, samplings, strict=True)
                ]
            },
        }
    )


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """One real probe of a sampler fault: the three traces as the engines returned them, and saved."""
    tree = buggy_tinyserve(tmp_path_factory.mktemp("minp"), *MIN_P_HALVED)
    sc, prober = scenario(), Prober()
    target = prober.run_target(sc, tree)
    teacher = target.sequences()
    high = prober.run_reference(sc, sc.reference.dtype, teacher, None)
    low = prober.run_reference(sc, sc.target.dtype, teacher, None)
    folder = tmp_path_factory.mktemp("traces")
    for name, trace in (("target", target), ("high", high), ("low", low)):
        trace_io.save(trace, folder / name)
    return sc, (target, low, high), folder


def test_streaming_compare_equals_the_eager_compare_exactly(probed):
    sc, (target, low, high), folder = probed
    eager = compare_traces(sc, target, low, high)  # what the probe computes from the engines' traces
    loaded = [trace_io.load(folder / n) for n in ("target", "low", "high")]
    lazy = [trace_io.load(folder / n, lazy=True) for n in ("target", "low", "high")]
    assert eager.first is not None and eager.first.tap == "sampler.probs", eager.summary  # a real divergence
    for other in (compare_traces(sc, *loaded), compare_traces(sc, *lazy)):
        assert other.to_dict() == eager.to_dict()
        assert other.first == eager.first
        assert len(other.stats) == len(eager.stats) > 0
        for a, b in zip(other.stats, eager.stats, strict=True):
            assert (a.tap, a.request, a.positions, a.steps, a.nonfinite) == (
                b.tap,
                b.request,
                b.positions,
                b.steps,
                b.nonfinite,
            )
            for field in ("ratio", "err_t", "err_r"):
                assert torch.equal(getattr(a, field), getattr(b, field)), (a.tap, a.request, field)


def test_streaming_compare_covers_every_layer_tap(probed):
    sc, (target, low, high), folder = probed
    lazy = compare_traces(sc, *(trace_io.load(folder / n, lazy=True) for n in ("target", "low", "high")))
    compared = {s.tap for s in lazy.stats}
    assert {t for t in target.taps() if t.startswith("layers.")} <= compared
    assert {"layers.0", "layers.1", "logits"} <= {k for k, _ in lazy.layers}
