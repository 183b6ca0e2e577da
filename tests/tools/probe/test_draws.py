"""The drawn tokens' uniformity test (tools.probe.draws) on exact distributions: calibrated under a
correct sampler, and rejecting the wrong draws it is built for."""

from __future__ import annotations

import math

import pytest
import torch

from tools.probe import draws

V = 64


def distributions(g: torch.Generator, n: int, sharpness: float) -> torch.Tensor:  # -> [n, V]
    """Kept distributions of varied shape: softmax of Gaussian logits, a top-16 cut on every other row."""
    x = torch.randn(n, V, generator=g, dtype=torch.float64) * sharpness
    cut = x < x.topk(16, dim=-1).values[:, -1:]
    cut[::2] = False
    return torch.softmax(x.masked_fill(cut, float("-inf")), -1)


def race(g):  # E ~ Exp(1) per token
    return lambda p: torch.empty_like(p).exponential_(generator=g)


SAMPLERS = {
    "correct": lambda g: lambda p: (p / race(g)(p)).argmax(-1),
    "greedy": lambda g: lambda p: p.argmax(-1),
    "race on sqrt(E), draws p^2": lambda g: lambda p: (p / race(g)(p).sqrt()).argmax(-1),
    "race on E^2, draws sqrt(p)": lambda g: lambda p: (p / race(g)(p).square()).argmax(-1),
    "argmax p + 0.1 E": lambda g: lambda p: (p + 0.1 * race(g)(p) * (p > 0)).argmax(-1),
    "before temperature 0.5": lambda g: lambda p: (p**0.5 / race(g)(p)).argmax(-1),
}


def p_values(sampler: str, seeds: int, n: int, sharpness: float) -> list[float]:
    out = []
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        q = distributions(g, n, sharpness)
        tokens = SAMPLERS[sampler](g)(q)
        v = draws.pit_uniforms(seed)
        u = [draws.pit(q[i], int(tokens[i]), v.random()) for i in range(n)]
        out.append(draws.uniformity_p(u)[0])
    return out


def test_the_pit_of_a_draw_spans_its_own_interval_most_likely_first():
    q = torch.tensor([0.1, 0.5, 0.0, 0.4], dtype=torch.float64)
    assert draws.pit(q, 1, 0.0) == 0.0 and draws.pit(q, 1, 1.0) == pytest.approx(0.5)
    assert draws.pit(q, 3, 0.5) == pytest.approx(0.5 + 0.2)
    assert draws.pit(q, 0, 1.0) == pytest.approx(1.0)
    tie = torch.tensor([0.5, 0.5], dtype=torch.float64)  # ties by token id
    assert draws.pit(tie, 0, 0.5) == pytest.approx(0.25) and draws.pit(tie, 1, 0.5) == pytest.approx(0.75)


def test_the_exact_tails():
    # chi2 with 2 degrees of freedom is Exp(1/2); with 4, (1 + x/2) exp(-x/2)
    assert draws.chi2_even_sf(3.0, 1) == pytest.approx(math.exp(-1.5))
    assert draws.chi2_even_sf(3.0, 2) == pytest.approx(2.5 * math.exp(-1.5))
    assert draws.chi2_even_sf(2000.0, 50) < 1e-300 or draws.chi2_even_sf(2000.0, 50) < 1e-100
    assert draws.ks_distance([0.5]) == pytest.approx(0.5)
    assert draws.dkw_p(0.0, 10) == 1.0


def test_calibrated_under_a_correct_sampler():
    """400 correct samples of 40 draws: the p-values are valid (P(p <= a) <= a). Bonferroni and the DKW
    bound make them conservative, so the tolerance is one-sided: 3 binomial standard deviations."""
    ps = p_values("correct", 400, 40, 2.0)
    for a in (0.05, 0.2):
        rate = sum(p <= a for p in ps) / len(ps)
        assert rate <= a + 3 * math.sqrt(a * (1 - a) / len(ps)), (a, rate)
    assert min(ps) > draws.ALPHA


def test_fishers_part_is_exact_not_just_valid():
    """The low-side Fisher p alone is uniform under a correct sampler (its null law is exact): its rate
    at 0.1 is within 3 standard deviations of 0.1 on both sides."""
    g = torch.Generator().manual_seed(1)
    q = distributions(g, 400 * 30, 1.5)
    tokens = SAMPLERS["correct"](g)(q)
    v = draws.pit_uniforms(0)
    u = [draws.pit(q[i], int(tokens[i]), v.random()) for i in range(len(q))]
    ps = [draws.fisher_p(u[i : i + 30]) for i in range(0, len(u), 30)]
    rate = sum(p <= 0.1 for p in ps) / len(ps)
    assert abs(rate - 0.1) <= 3 * math.sqrt(0.09 / len(ps)), rate


@pytest.mark.parametrize(
    "sampler,n",
    [
        ("greedy", 80),
        ("race on sqrt(E), draws p^2", 320),
        ("race on E^2, draws sqrt(p)", 320),
        ("argmax p + 0.1 E", 320),
        ("before temperature 0.5", 320),
    ],
)
def test_rejects_each_biased_sampler(sampler, n):
    """Each wrong draw on peaked distributions (Gaussian logits of scale 3, as a trained model's): rejected
    at ALPHA in at least 9 of 10 samples of n draws (docs/sampling.md: the draws each needs on a real engine)."""
    ps = p_values(sampler, 10, n, 3.0)
    assert sum(p < draws.ALPHA for p in ps) >= 9, ps


def test_too_few_informative_draws_is_undecided_not_agree():
    few = [draws.Draw(0, i, i, 0.5) for i in range(draws.MIN_DRAWS - 1)]
    test = draws.DrawTest.of(few, [0], {}, 3)
    assert test.verdict == "undecided" and "undecided" in test.line() and "agree" not in test.line()
    greedy = [draws.Draw(0, i, i, 0.01 * (i % 7)) for i in range(draws.MIN_DRAWS)]
    test = draws.DrawTest.of(greedy, [0], {}, 0)
    assert test.verdict == "reject" and test.side == "low" and test.ratio > 4
    assert "do not follow the kept probabilities" in test.line()


def test_a_degenerate_distribution_is_not_informative():
    assert not draws.informative(torch.tensor([0.995, 0.005]))
    assert draws.informative(torch.tensor([0.9, 0.1]))


def test_requests_seeded_alike_are_pooled_once():
    pooled, left = draws.pool({1: 7, 2: None, 4: 17, 5: 17, 6: None})
    assert pooled == [1, 2, 4, 6] and left == {5: "seeded like request 4"}


def test_coincidences_bound_and_which_tokens_count():
    assert draws.coincidence_p(0, 3.0) == 1.0
    assert draws.coincidence_p(10, 0.5) == pytest.approx(math.exp(-(20 - math.expm1(2.0) * 0.5)))
    earlier = draws.earlier_tokens({1: {0: 5, 1: 6}, 3: {0: 5, 2: 9}, 4: {0: 7, 1: 6, 2: 1}})
    assert earlier == {1: {}, 3: {0: {5}}, 4: {0: {5}, 1: {6}, 2: {9}}}


def test_coincidences_are_calibrated_and_shared_noise_is_caught():
    """Two rows of different diffuse distributions at each of 100 steps: drawn independently, the
    coincidence bound's p is valid (no more than 3 standard deviations over a at 0.05, 200 samples);
    drawn with one noise vector, rejected at ALPHA in at least 19 of 20 samples."""
    independent, shared = [], []
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        q = distributions(g, 200, 1.0).view(100, 2, V)
        for same in (False, True) if seed < 20 else (False,):
            e1 = torch.empty(100, V, dtype=torch.float64).exponential_(generator=g)
            e2 = e1 if same else torch.empty(100, V, dtype=torch.float64).exponential_(generator=g)
            a, b = (q[:, 0] / e1).argmax(-1), (q[:, 1] / e2).argmax(-1)
            hits, chance = int((a == b).sum()), float(q[:, 1].gather(1, a.unsqueeze(1)).sum())
            (shared if same else independent).append(draws.coincidence_p(hits, chance))
    rate = sum(p <= 0.05 for p in independent) / len(independent)
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / len(independent)), rate
    assert sum(p < draws.ALPHA for p in shared) >= 19, shared
