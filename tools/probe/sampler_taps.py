"""The sampler's taps judged as sampling: both samplers fed one input (docs/design.md §3, issue 16).

`sampler.logits` (penalties, temperature) is continuous and is compared by error ratio like any
tap. `sampler.probs` and `sampler.token` are not: a top-k / top-p / min-p cut is a discontinuity,
and a logit within rounding noise of it legitimately carries a token in or out of the kept set
(a bf16 model moves logits by ~1e-2). So the reference sampler (tools.probe.sampling_ref) is given the
target's own sampler input, and the target's kept set and probabilities are judged against the
reference's kept bounds on that input, a token within the noise margin of a cut being undecided:

- the target's `sampler.logits`, when it reports them before the cuts (tinyserve, vLLM-style);
- else the target's `logits` through the reference penalties and temperature (transformers
  reports its scores after the cuts) — tensor replacement at `sampler.logits`;
- else (neither captured) the reference's own `sampler.logits`, with the margin widened by the
  measured logit noise between the two.

Upstream noise then cannot move a cut; a wrong cut, scale, order or renormalisation still does.
A sampled token must lie in the reference's possibly-kept set (`sampler.token`); greedy tokens
are judged by `tools.probe.prober.greedy_token_divergence`. Whether the drawn tokens follow the kept
probabilities, not just stay inside the kept set, is judged on all of them together by a uniformity
test of their probability-integral values (tools.probe.draws), the pseudo-tap `sampler.draws`.
"""

from __future__ import annotations

import torch

from tools.probe import compare, draws
from tools.probe import taps as tapnames
from tools.probe.align import TapRows, index
from tools.probe.sampling_ref import adjust_row, kept_bounds
from tools.probe.trace import Trace
from tools.scenario import Request, Scenario

GREEDY = {"top_k": 1}  # a greedy row keeps its best token; every other token is undecided
SAMPLER_INPUTS = ("sampler.probs", "sampler.token", "sampler.logits", "logits")  # the taps judging sampling reads


def sampler_stats(scenario: Scenario, target: Trace, high: Trace) -> list[compare.TapStat]:
    """TapStats of `sampler.probs` and `sampler.token` per request, judged as sampling."""
    return sampler_judgement(scenario, target, high, with_draws=False)[0]


def sampler_judgement(
    scenario: Scenario, target: Trace, high: Trace, with_draws: bool = True
) -> tuple[list[compare.TapStat], draws.DrawTest | None]:
    """`sampler_stats`, and (`with_draws`) the test of the sampled requests' drawn tokens (None without
    a sampled request) with its `sampler.draws` stats when it ran."""
    t_idx, y_idx = index(target, SAMPLER_INPUTS), index(high, SAMPLER_INPUTS)
    seeds = {
        r: req.sampling.get("seed")
        for r, req in enumerate(scenario.requests)
        if not req.greedy and ("sampler.probs", r) in t_idx and ("sampler.token", r) in t_idx
    }
    pooled, left_out = draws.pool(seeds)
    earlier = draws.earlier_tokens({r: _drawn_ids(t_idx[("sampler.token", r)]) for r in pooled})
    stats, drawn, skipped = [], [], 0
    for r, req in enumerate(scenario.requests):
        probs = t_idx.get(("sampler.probs", r))
        if probs is None:
            continue
        seq, n_prompt = target.sequences()[r], len(target.outputs[r].prompt_ids)
        x, eps = sampler_input(t_idx, y_idx, r, probs.positions, seq, n_prompt, req.sampling, scenario.target.dtype)
        if x is None:
            continue
        bounds = [row_bounds(x[i], req, eps) for i in range(len(probs.positions))]
        stats.append(probs_stat(r, probs, x, bounds))
        tokens = t_idx.get(("sampler.token", r))
        if tokens is not None and not req.greedy:
            stats.append(token_stat(r, tokens, probs.positions, bounds))
            if with_draws and r in pooled:
                got, left = request_draws(r, probs, tokens, x, bounds, earlier.get(r, {}))
                drawn += got
                skipped += left
    if not with_draws or not seeds:
        return stats, None
    test = draws.DrawTest.of(drawn, pooled, left_out, skipped)
    return stats + draw_stats(test), test


def _drawn_ids(tokens: TapRows) -> dict[int, int]:
    """step -> the token drawn at it."""
    return {step: int(tokens.tensor[i][0]) for i, step in enumerate(tokens.steps)}


def request_draws(
    r: int, probs: TapRows, tokens: TapRows, x: torch.Tensor, bounds, earlier: dict[int, set[int]]
) -> tuple[list[draws.Draw], int]:
    """One sampled request's informative draws (their PIT under the reference's kept probabilities on the
    target's sampler input, the target's undecided tokens as it kept them; and whether each drew a token
    `earlier` (step -> ids) pooled requests drew at its step, with the chance of that), and how many were
    left out: degenerate, or drawn outside the reference's possibly-kept set (`token_stat` judges those)."""
    rows = {p: i for i, p in enumerate(tokens.positions)}
    v = draws.pit_uniforms(r)
    out, skipped = [], 0
    for i, p in enumerate(probs.positions):
        if p not in rows:
            continue
        token, u_rand = int(tokens.tensor[rows[p]][0]), v.random()  # one v per draw, used or not
        sure, maybe = bounds[i]
        keep = sure | (maybe & (probs.tensor[i] > 0))
        q = torch.softmax(x[i].double().masked_fill(~keep, float("-inf")), -1)
        if not bool(keep[token]) or not draws.informative(q):
            skipped += 1
            continue
        step = tokens.steps[rows[p]]
        shared = sorted(earlier.get(step, ()))
        chance = float(q[shared].sum()) if shared else 0.0
        out.append(draws.Draw(r, p, step, draws.pit(q, token, u_rand), chance, token in shared))
    return out, skipped


def draw_stats(test: draws.DrawTest) -> list[compare.TapStat]:
    """The test as one `sampler.draws` TapStat per pooled request with informative draws (none when it
    could not run): every row carries the pooled verdict's ratio (`DrawTest.ratio`)."""
    if test.verdict == "undecided":
        return []
    out = []
    for r in test.requests:
        mine = [d for d in test.draws if d.request == r]
        if mine:
            ratio = torch.full((len(mine),), test.ratio, dtype=torch.float64)
            positions, steps = [d.position for d in mine], [d.step for d in mine]
            out.append(compare.summarize(tapnames.DRAWS_TAP, r, positions, steps, ratio))
    return out


def row_bounds(x: torch.Tensor, req: Request, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[V] -> ([V] sure, [V] maybe). Greedy rows: engines may or may not truncate a distribution
    they never draw from, so only the best token is sure and every token may be kept."""
    if req.greedy:
        sure, _ = kept_bounds(x, GREEDY, eps)
        return sure, torch.ones_like(sure)
    return kept_bounds(x, req.sampling, eps, mass_tol=eps)


def probs_stat(r: int, probs: TapRows, x: torch.Tensor, bounds) -> compare.TapStat:
    errors = [compare.kept_set_error(probs.tensor[i], x[i], *bounds[i])[0] for i in range(len(bounds))]
    nonfinite = not compare.all_finite(probs.tensor)
    return compare.sampling_stat("sampler.probs", r, probs.positions, probs.steps, errors, nonfinite)


def token_stat(r: int, tokens: TapRows, positions: list[int], bounds) -> compare.TapStat:
    """A drawn token the reference sampler surely drops is an error of 1 (far above the floor)."""
    rows = {p: i for i, p in enumerate(tokens.positions)}
    keep = [p for p in positions if p in rows]
    errors = [0.0 if bool(bounds[positions.index(p)][1][int(tokens.tensor[rows[p]][0])]) else 1.0 for p in keep]
    steps = [tokens.steps[rows[p]] for p in keep]
    return compare.sampling_stat("sampler.token", r, keep, steps, errors)


def sampler_input(
    t_idx: dict, y_idx: dict, r: int, positions: list[int], seq: list[int], n_prompt: int, sampling: dict, dtype: str
) -> tuple[torch.Tensor | None, float]:
    """The sampler input at `positions` ([P, V], fp64) both samplers are judged on, and its logit margin."""
    own = _rows(t_idx.get(("sampler.logits", r)), positions)
    ref = _rows(y_idx.get(("sampler.logits", r)), positions)
    if own is not None and ref is not None and _finite_where(own, ref):
        return own.double(), compare.SAMPLER_EPS  # reported before the cuts: the target's own
    raw = _rows(t_idx.get(("logits", r)), positions)
    if raw is not None:
        x = [
            adjust_row(raw[i].double(), seq[: p + 1], seq[n_prompt : p + 1], sampling) for i, p in enumerate(positions)
        ]
        return torch.stack(x), compare.SAMPLER_EPS
    if ref is None:
        return None, 0.0
    return ref.double(), compare.SAMPLER_EPS + logit_noise(own, ref, dtype)


def _finite_where(own: torch.Tensor, ref: torch.Tensor) -> bool:
    """`own` is finite wherever `ref` is (at once when `own` is finite everywhere)."""
    return compare.all_finite(own) or bool((torch.isfinite(own) | ~torch.isfinite(ref)).all())


def logit_noise(own: torch.Tensor | None, ref: torch.Tensor, dtype: str) -> float:
    """[P, V] x2 -> largest |difference| over the entries finite in both (the dtype's greedy margin
    when the target reported nothing to measure it on)."""
    if own is None:
        return compare.TOKEN_MARGIN[dtype]
    both = torch.isfinite(own) & torch.isfinite(ref)
    return float((own.double() - ref.double())[both].abs().max()) if bool(both.any()) else compare.TOKEN_MARGIN[dtype]


def _rows(rows: TapRows | None, positions: list[int]) -> torch.Tensor | None:
    """The rows at `positions` ([P, F]), or None when any is missing."""
    if rows is None or not set(positions) <= set(rows.positions):
        return None
    at = {p: i for i, p in enumerate(rows.positions)}
    return rows.tensor[[at[p] for p in positions]]
