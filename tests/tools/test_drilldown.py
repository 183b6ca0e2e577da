"""Divergence pattern clues (pure)."""

from tools.drilldown import describe, divergence_pattern
from tools.probe.compare import Divergence
from tools.probe.prober import ProbeResult


def result(first):
    return ProbeResult("float32", first, {}, [], [first.tap], 3)


def test_decode_only_and_request_subset_are_reported():
    first = Divergence("layers.1.attn.out", 3, [1], [20, 21, 22], [3, 4, 5], 50.0)
    pattern = divergence_pattern(result(first), prompt_lengths=[10, 20])
    assert pattern["decode_only"] and not pattern["all_requests"] and pattern["positions"] == "20-22"
    lines = describe(pattern, first.tap)
    assert any("only requests [1]" in line for line in lines)
    assert any("decode" in line for line in lines)


def test_prefill_divergence_is_not_decode_only():
    first = Divergence("layers.0.attn.q_rot", 0, [0], [1, 2, 3], [0, 0, 0], 9.0)
    pattern = divergence_pattern(result(first), prompt_lengths=[8])
    assert not pattern["decode_only"] and pattern["prefill_only"]
