"""Do the drawn tokens follow the kept probabilities? A uniformity test of their PIT values. Pure.

The kept-set judgements (tools.probe.sampler_taps) see the distribution a sampler draws from and
whether each drawn token is one the reference could draw; they cannot see a draw that stays inside
the kept set but does not follow its probabilities (a sampler that ignores its random numbers, a
biased uniform, an exponential race with the wrong law, argmax plus a constant noise, drawing from
the distribution before temperature while reporting the one after). This test can.

**The statistic.** For a drawn token t with kept probabilities q (the reference sampler's, on the
target's own sampler input), order the vocabulary by q, most likely first, ties by token id, and take

    u = (mass of the tokens before t) + v * q(t),    v ~ U(0, 1) from a fixed-seed generator,

the randomized probability-integral transform. If t was drawn from q, u is exactly U(0, 1): t is the
j-th token with probability q_j and then u is uniform on [F_{j-1}, F_j), an interval of that length.
That holds given everything before the draw, so u is uniform *given the past* as well, whatever the
distributions are; a sequence of draws (one request's, or several requests' with their own random
numbers) therefore gives independent U(0, 1) values: each one's conditional law given the earlier
ones is U(0, 1), which makes them jointly independent. v is from a fixed seed, so a verdict is
reproducible.

**What carries information.** A draw whose most likely kept token holds DEGENERATE of the mass or more
is left out: any sampler draws that token, and its u says nothing about how it draws. Leaving a draw
out on its distribution alone (fixed before the draw) keeps the others independent uniforms.

**Draws that share noise.** Each request's u's can be right while requests draw with one noise vector
(a batch given one seed, one generator state reused across rows): each row's law is right, their
draws are not independent. Under a correct sampler a request's draw is independent of the other
pooled requests' draws at the same step, so it lands on a token one of them drew with the chance its
own kept probabilities give those tokens, known before it draws. The coincidences H and the sum M of
those chances make exp(L H - (e^L - 1) M) a supermartingale, so P(L H - (e^L - 1) M >= t) <= e^-t.

**The test.** Four statistics with exact or bounded null tails, combined by Bonferroni:
Fisher's -2 sum log u ~ chi2(2n) (large when the u's crowd near 0: draws likelier than the
probabilities say, as from a too greedy sampler), the same on 1 - u (draws less likely than they
should be: a too flat sampler), the Kolmogorov-Smirnov distance D, whose tail is bounded by
2 exp(-2 n D^2) for every n (Massart's form of the Dvoretzky-Kiefer-Wolfowitz inequality) for the
other shapes, and the coincidences' bound. p = min(1, 4 * the smallest of the four) is a valid
p-value: P(p <= a) <= a under a correct sampler. The draws reject at p < ALPHA; with fewer than
MIN_DRAWS informative draws the verdict is "undecided", never "agree".
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

ALPHA = 1e-6  # false-alarm bound of one cell's test (one test per probe): 200 bug-free cells, 2e-4 in all
MIN_DRAWS = 20  # informative draws below which the test is not run (undecided)
DEGENERATE = 0.99  # a kept distribution whose best token holds this much is not informative
PIT_SEED = 20261202  # the randomization of the PIT: fixed, so a verdict is reproducible
N_TESTS = 4  # Fisher near 0, Fisher near 1, Kolmogorov-Smirnov, coincidences: the Bonferroni factor
COINCIDENCE_LAMBDA = 2.0  # the coincidence test's exponent (`coincidence_p`)

SIDES = {
    "low": "the drawn tokens are likelier than the kept probabilities make them (a too greedy draw)",
    "high": "the drawn tokens are less likely than the kept probabilities make them (a too flat draw)",
    "shape": "their PIT values are not uniform",
    "together": "requests with random numbers of their own drew the same token at the same step far more often "
    "than their probabilities make likely (their draws share noise)",
}


def pit(q: torch.Tensor, token: int, v: float) -> float:
    """[V] kept probabilities, the drawn token, v in [0, 1) -> its randomized PIT value in [0, 1]."""
    q = q.double()
    before = (q > q[token]) | ((q == q[token]) & (torch.arange(q.shape[-1]) < token))
    return float(q[before].sum() + v * q[token])


def informative(q: torch.Tensor) -> bool:
    """[V] kept probabilities -> whether a draw from them says anything about how the sampler draws."""
    return float(q.max()) < DEGENERATE


def pit_uniforms(request: int) -> random.Random:
    """The fixed-seed stream of v's for one request's draws."""
    return random.Random(PIT_SEED * 1_000_003 + request)


def chi2_even_sf(x: float, n: int) -> float:
    """P(chi2 with 2n degrees of freedom >= x), exactly: exp(-x/2) sum_{k<n} (x/2)^k / k!."""
    if x <= 0:
        return 1.0
    y = x / 2
    logs = [k * math.log(y) - math.lgamma(k + 1) - y for k in range(n)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in logs))


def fisher_p(u: list[float]) -> float:
    """P under uniformity of a Fisher statistic -2 sum log u at least this large (u crowding near 0)."""
    return chi2_even_sf(-2 * sum(math.log(max(x, 1e-300)) for x in u), len(u))


def ks_distance(u: list[float]) -> float:
    """sup_x |F_n(x) - x| of the sample's empirical distribution."""
    s, n = sorted(u), len(u)
    return max(max((i + 1) / n - x, x - i / n) for i, x in enumerate(s))


def dkw_p(d: float, n: int) -> float:
    """Bound on P(D_n >= d) under uniformity, for every n: 2 exp(-2 n d^2) (Massart)."""
    return min(1.0, 2 * math.exp(-2 * n * d * d))


def coincidence_p(hits: int, expected: float) -> float:
    """Bound on P(at least `hits` coincidences) when each draw coincides, given the past, with a probability
    known before it whose sum is `expected`: exp(L H - (e^L - 1) M) is then a supermartingale (a sum of
    conditionally Bernoulli terms), so P(L H - (e^L - 1) M >= t) <= exp(-t) for any M, whatever the steps."""
    lam = COINCIDENCE_LAMBDA
    return min(1.0, math.exp(-(lam * hits - math.expm1(lam) * expected)))


def uniformity_p(u: list[float], hits: int = 0, expected: float = 0.0) -> tuple[float, str]:
    """PIT values (and coincidences: their count, and the sum of their chances) -> (Bonferroni p over the
    four statistics, the side that gave it: SIDES' key)."""
    parts = {
        "low": fisher_p(u),
        "high": fisher_p([1 - x for x in u]),
        "shape": dkw_p(ks_distance(u), len(u)),
        "together": coincidence_p(hits, expected),
    }
    side = min(parts, key=lambda k: parts[k])
    return min(1.0, N_TESTS * parts[side]), side


@dataclass
class Draw:
    request: int
    position: int
    step: int
    u: float
    chance: float = (
        0.0  # probability, under its kept probabilities, of a token earlier pooled requests drew at its step
    )
    coincides: bool = False  # it drew one of them


@dataclass
class DrawTest:
    """The pooled draws of the requests whose random numbers are their own, and the verdict on them."""

    draws: list[Draw]  # the informative ones
    requests: list[int]  # sampled requests pooled
    left_out: dict[int, str] = field(default_factory=dict)  # sampled request -> why it is not pooled
    skipped: int = 0  # draws left out as degenerate or outside the kept set
    p: float = 1.0
    side: str = "shape"

    @classmethod
    def of(cls, draws: list[Draw], requests: list[int], left_out: dict[int, str], skipped: int) -> DrawTest:
        test = cls(draws, requests, left_out, skipped)
        if len(draws) >= MIN_DRAWS:
            test.p, test.side = uniformity_p([d.u for d in draws], test.coincidences, test.expected)
        return test

    @property
    def n(self) -> int:
        return len(self.draws)

    @property
    def coincidences(self) -> int:
        return sum(d.coincides for d in self.draws)

    @property
    def expected(self) -> float:
        return sum(d.chance for d in self.draws)

    @property
    def verdict(self) -> str:
        """'undecided' (too few informative draws), 'reject' (p < ALPHA) or 'agree'."""
        if self.n < MIN_DRAWS:
            return "undecided"
        return "reject" if self.p < ALPHA else "agree"

    @property
    def ratio(self) -> float:
        """The verdict on compare.THRESHOLD's scale: 4 log p / log ALPHA, over 4 exactly when p < ALPHA."""
        return 4.0 * math.log(max(self.p, 1e-300)) / math.log(ALPHA)

    @property
    def mean(self) -> float:
        """The PIT values' mean: 0.5 under a correct sampler, below for draws too likely, above for too unlikely."""
        return sum(d.u for d in self.draws) / max(1, self.n)

    def line(self) -> str:
        if self.verdict == "undecided":
            return (
                f"whether the drawn tokens follow the kept probabilities is undecided: {self.n} informative "
                f"draws (requests {self.requests}), {MIN_DRAWS} needed"
            )
        if self.verdict == "agree":
            return f"the drawn tokens follow the kept probabilities (p = {self.p:.2g}, {self.n} informative draws)"
        return (
            f"the drawn tokens do not follow the kept probabilities (p = {self.p:.2g}, {self.n} informative draws, "
            f"requests {self.requests}): {SIDES[self.side]}; " + self.evidence()
        )

    def evidence(self) -> str:
        if self.side == "together":
            return f"{self.coincidences} times, {self.expected:.2g} expected"
        return f"their mean PIT value is {self.mean:.2f}, 0.5 when right"


def pool(seeds: dict[int, int | None]) -> tuple[list[int], dict[int, str]]:
    """Sampled request -> its seed (None: unseeded) => (requests whose random numbers are their own,
    request -> why left out). A request seeded like an earlier one legitimately reuses its random
    numbers, so its u's are not independent of that one's; unseeded ones draw fresh numbers."""
    taken: dict[int, int] = {}
    pooled, left_out = [], {}
    for r, seed in sorted(seeds.items()):
        if seed is not None and seed in taken:
            left_out[r] = f"seeded like request {taken[seed]}"
            continue
        if seed is not None:
            taken[seed] = r
        pooled.append(r)
    return pooled, left_out


def earlier_tokens(drawn: dict[int, dict[int, int]]) -> dict[int, dict[int, set[int]]]:
    """Pooled request -> (step -> its drawn token) => request -> (step -> the tokens pooled requests before
    it drew at that step). Under a correct sampler each draw is independent of the others' at its step, so
    it lands among them with the chance its own kept probabilities give them."""
    out: dict[int, dict[int, set[int]]] = {}
    seen: dict[int, set[int]] = {}
    for r in sorted(drawn):
        out[r] = {step: set(seen[step]) for step in drawn[r] if seen.get(step)}
        for step, token in drawn[r].items():
            seen.setdefault(step, set()).add(token)
    return out
