"""Pure numerics of the comparison: robust ratio, first divergence, token check."""
import torch

from tools import compare
from tools.align import Aligned, align
from tools.trace import RequestOutput, TapRecord, Trace


def stat(tap, ratio, positions=None, steps=None, request=0):
    n = len(ratio)
    r = torch.tensor(ratio, dtype=torch.float64)
    return compare.TapStat(tap, request, positions or list(range(n)), steps or [0] * n, r, r, torch.ones(n))


def test_robust_ratio_is_near_one_for_reference_like_noise():
    torch.manual_seed(0)
    y = torch.randn(8, 32, dtype=torch.float64)
    r = y + 1e-3 * torch.randn_like(y)
    t = y + 1e-3 * torch.randn_like(y)
    ratio, *_ = compare.robust_ratio(t, r, y, floor=1e-6)
    assert 0.5 < float(ratio.median()) < 2.0


def test_floor_keeps_exact_reference_rows_from_exploding():
    y = torch.ones(2, 4, dtype=torch.float64)
    ratio, err_t, err_r, _ = compare.robust_ratio(y + 1e-7, y.clone(), y, floor=1e-5)
    assert float(err_r.max()) == 0.0 and float(ratio.max()) < 0.1


def test_nan_in_target_is_a_divergence_and_flagged():
    y = torch.ones(2, 4, dtype=torch.float64)
    t = y.clone()
    t[1, 2] = float("nan")
    ratio, _, _, nonfinite = compare.robust_ratio(t, y.clone(), y, floor=1e-5)
    assert nonfinite and float(ratio[1]) > 1e4 and float(ratio[0]) < 1


def test_masked_logits_compare_on_their_finite_part():
    y = torch.tensor([[1.0, float("-inf"), 3.0]], dtype=torch.float64)
    ratio, _, _, nonfinite = compare.robust_ratio(y.clone(), y.clone(), y, floor=1e-5)
    assert not nonfinite and float(ratio[0]) == 0.0


def test_first_divergence_needs_persistence_or_output():
    spike = [stat("layers.0.attn.q", [1.0, 50.0, 1.0]), stat("layers.0.out", [1.0, 1.0, 1.0]),
             stat("logits", [1.0, 1.0, 1.0])]
    assert compare.first_divergence(spike) is None
    real = [stat("layers.0.attn.q", [1.0, 50.0, 1.0]), stat("layers.0.out", [1.0, 9.0, 9.0]),
            stat("logits", [1.0, 1.0, 1.0])]
    first = compare.first_divergence(real)
    assert first.tap == "layers.0.attn.q" and first.positions == [1]


def test_earlier_step_wins_over_earlier_layer():
    stats = [stat("layers.0.mlp.down", [1, 1, 9], steps=[0, 0, 1]), stat("layers.0.out", [1, 1, 9], steps=[0, 0, 1]),
             stat("layers.1.mlp.down", [9, 1, 1], steps=[0, 0, 1]), stat("layers.1.out", [9, 1, 1], steps=[0, 0, 1])]
    assert compare.first_divergence(stats).tap == "layers.1.mlp.down"


def test_token_divergence_ignores_near_ties():
    logits = torch.tensor([[0.0, 1.0, 1.0005], [0.0, 2.0, 0.0]])
    assert compare.token_divergence([9, 1, 0], 1, logits, [0, 1], margin=1e-3) == 2
    assert compare.token_divergence([9, 1, 1], 1, logits, [0, 1], margin=1e-3) is None


def test_compress_ranges():
    assert compare.compress([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert compare.compress([]) == "-"


def _trace(records):
    return Trace("e", "float32", [RequestOutput([1, 2], [3])], records)


def test_align_matches_rows_by_position_not_step():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    chunked = _trace([TapRecord("embed", 0, 0, [0, 1], x[:2]), TapRecord("embed", 1, 0, [2], x[2:])])
    whole = _trace([TapRecord("embed", 0, 0, [2, 0, 1], x[[2, 0, 1]])])
    (a,) = align(chunked, whole, whole)
    assert isinstance(a, Aligned) and a.positions == [0, 1, 2] and a.steps == [0, 0, 1]
    assert torch.equal(a.t, a.y)
