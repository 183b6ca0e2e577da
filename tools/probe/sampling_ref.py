"""Reference sampler transforms, for the `sampler.*` taps of a teacher-forced run.

Definitions (applied in this order, as transformers and vLLM do):
repetition penalty over prompt + output so far (divide positive logits, multiply
negative ones); presence / frequency penalties over output tokens so far
(OpenAI definition: logit -= presence * [count > 0] + frequency * count);
temperature; top-k; top-p (smallest set whose mass reaches p); min-p (drop tokens
whose probability is below min_p * max probability). Masked entries are -inf.
"""

from __future__ import annotations

import math

import torch


def processed_logits(logits: torch.Tensor, seq: list[int], n_prompt: int, sampling: dict, truncated: bool = True):
    """[P, V] logits at the sampled positions n_prompt-1 … -> ([P, V] after penalties and temperature
    (the `sampler.logits` tap), [P, V] after top-k / top-p / min-p as well (what `sampler.probs` uses);
    None instead when not `truncated`). A step that changes no row answers its input itself: a greedy
    request's vocabulary-wide rows are not copied for nothing."""
    adjusted, cut = [], []
    kept_rows = kept_cut = True  # every row so far returned as it came in
    for i in range(logits.shape[0]):
        p, row = n_prompt - 1 + i, logits[i]
        x = adjust_row(row, seq[: p + 1], seq[n_prompt : p + 1], sampling)
        adjusted.append(x)
        kept_rows = kept_rows and x is row
        if truncated:
            cut.append(y := truncate_row(x, sampling))
            kept_cut = kept_cut and y is x
    out = logits if kept_rows else torch.stack(adjusted)
    if not truncated:
        return out, None
    return out, out if kept_cut else torch.stack(cut)


def adjust_row(x: torch.Tensor, history: list[int], output: list[int], s: dict) -> torch.Tensor:  # [V] -> [V]
    x = repetition_penalty(x, history, float(s.get("repetition_penalty", 1.0)))
    x = presence_frequency(x, output, float(s.get("presence_penalty", 0.0)), float(s.get("frequency_penalty", 0.0)))
    t = float(s.get("temperature", 0.0))
    return x / t if t > 0 else x


def truncate_row(x: torch.Tensor, s: dict) -> torch.Tensor:  # [V] -> [V], dropped entries -inf
    x = top_k_mask(x, int(s.get("top_k", 0) or 0))
    x = top_p_mask(x, float(s.get("top_p", 1.0)))
    return min_p_mask(x, float(s.get("min_p", 0.0) or 0.0))


def repetition_penalty(x: torch.Tensor, tokens: list[int], penalty: float) -> torch.Tensor:
    if penalty == 1.0 or not tokens:
        return x
    idx = torch.tensor(sorted(set(tokens)))
    x = x.clone()
    v = x[idx]
    x[idx] = torch.where(v > 0, v / penalty, v * penalty)
    return x


def presence_frequency(x: torch.Tensor, output: list[int], presence: float, frequency: float) -> torch.Tensor:
    if (presence == 0 and frequency == 0) or not output:
        return x
    counts = torch.bincount(torch.tensor(output), minlength=x.shape[-1]).to(x.dtype)
    return x - presence * (counts > 0).to(x.dtype) - frequency * counts


def penalize(
    x: torch.Tensor, seen: torch.Tensor, counts: torch.Tensor, rep: torch.Tensor, pres: torch.Tensor, freq: torch.Tensor
) -> torch.Tensor:
    """[S, V] logits, [S, V] seen in prompt or output, [S, V] output counts, [S] penalties -> [S, V] fp64:
    the batched form of `repetition_penalty` then `presence_frequency` (a row's own penalties)."""
    x = x.double()
    r = rep.double().view(-1, 1)
    x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    counts = counts.double()
    return x - pres.double().view(-1, 1) * (counts > 0).double() - freq.double().view(-1, 1) * counts


def token_counts(ids: list[int], vocab: int) -> torch.Tensor:  # token ids -> [V] occurrences (ids outside dropped)
    t = torch.tensor([i for i in ids if 0 <= i < vocab], dtype=torch.long)
    return torch.bincount(t, minlength=vocab)[:vocab]


def top_k_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= x.shape[-1]:
        return x
    kth = torch.topk(x, k).values[-1]
    return x.masked_fill(x < kth, float("-inf"))


def top_p_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    if p >= 1.0:
        return x
    sorted_x, order = torch.sort(x, descending=True)
    cum = torch.softmax(sorted_x, -1).cumsum(-1)
    drop_sorted = (cum - torch.softmax(sorted_x, -1)) >= p  # mass before this token already reaches p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return x.masked_fill(drop, float("-inf"))


def min_p_mask(x: torch.Tensor, min_p: float) -> torch.Tensor:
    if min_p <= 0:
        return x
    probs = torch.softmax(x, -1)
    return x.masked_fill(probs < min_p * probs.max(), float("-inf"))


# ---- kept sets with a noise margin ---------------------------------------------------------------
# A cut (top-k, top-p, min-p) is a discontinuity: a logit moved by rounding noise can carry a token
# across it. `kept_bounds` says, for logits each known only to within ±eps, which tokens every such
# perturbation keeps (`sure`) and which some perturbation keeps (`maybe`); the rest are surely dropped.
# Tokens in `maybe` but not in `sure` are undecided: an engine may keep or drop them.


def kept_bounds(x: torch.Tensor, s: dict, eps: float, mass_tol: float = 0.0):
    """[V] sampler input (after penalties and temperature) -> ([V] sure, [V] maybe) kept under
    top-k, then top-p, then min-p, for logits known to within ±eps and cut masses to within mass_tol.
    With eps = mass_tol = 0 both equal the kept set of `truncate_row` (ties aside)."""
    x = x.double()
    k_sure, k_maybe = top_k_bounds(x, int(s.get("top_k", 0) or 0), eps)
    p_sure, p_maybe = top_p_bounds(x, float(s.get("top_p", 1.0)), eps, mass_tol, k_sure, k_maybe)
    m_sure, m_maybe = min_p_bounds(x, float(s.get("min_p", 0.0) or 0.0), eps)
    return k_sure & p_sure & m_sure, k_maybe & p_maybe & m_maybe


def _mass_above(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[V] values, [V] weights, [N] thresholds -> [N] sum of w_j over x_j > t_n."""
    asc, order = torch.sort(x)
    cum = torch.cat([torch.zeros(1, dtype=w.dtype), torch.cumsum(w[order], 0)])
    return cum[-1] - cum[torch.searchsorted(asc, t, right=True)]


def top_k_bounds(x: torch.Tensor, k: int, eps: float):
    """[V] -> ([V] sure, [V] maybe): kept iff fewer than k others lie strictly above (ties survive)."""
    if k <= 0 or k >= x.shape[-1]:
        ones = torch.ones_like(x, dtype=torch.bool)
        return ones, ones
    # fewer than k values lie strictly above t  <=>  t >= the k-th largest value (ties counted): a top-k
    # of k + 1 values instead of sorting the vocabulary, the same comparisons as counting
    top = torch.topk(x, k + 1).values
    # others that may lie above x_i: all values above x_i - 2eps, less x_i itself when eps > 0
    sure = x - 2 * eps >= top[k] if eps > 0 else x >= top[k - 1]
    return sure, x + 2 * eps >= top[k - 1]  # others surely above: all values above x_i + 2eps


def top_p_bounds(x: torch.Tensor, p: float, eps: float, mass_tol: float, k_sure: torch.Tensor, k_maybe: torch.Tensor):
    """[V] -> ([V] sure, [V] maybe): kept iff the mass of the tokens above it, within the top-k set,
    is below p. Bounds: the mass above is largest when the tokens within 2eps of it sit above it,
    rise by eps while the rest fall by eps, and undecided top-k tokens join only the side above."""
    if p >= 1.0:
        ones = torch.ones_like(x, dtype=torch.bool)
        return ones, ones
    w = torch.exp(x - x.max())
    ws, wm = w * k_sure, w * k_maybe
    self_in = (lambda v: v) if eps > 0 else (lambda v: torch.zeros_like(v))
    above_hi = (_mass_above(x, wm, x - 2 * eps) - self_in(wm)) * math.exp(eps)
    below_lo = (ws.sum() - _mass_above(x, ws, x - 2 * eps) - (ws - self_in(ws)) + w) * math.exp(-eps)
    above_lo = _mass_above(x, ws, x + 2 * eps) * math.exp(-eps)
    below_hi = (wm.sum() - _mass_above(x, wm, x + 2 * eps) - wm + w) * math.exp(eps)
    hi = above_hi / (above_hi + below_lo)
    lo = above_lo / (above_lo + below_hi)
    # the best token always survives; within 2eps of the best, any of them may be the best
    top_maybe = x >= x.max() - 2 * eps
    top_sure = top_maybe & (top_maybe.sum() == 1)
    return (hi + mass_tol < p) | top_sure, (lo - mass_tol < p) | top_maybe


def min_p_bounds(x: torch.Tensor, min_p: float, eps: float):
    """[V] -> ([V] sure, [V] maybe): kept iff p_i >= min_p * p_max, i.e. x_i - x_max >= log(min_p)
    (the softmax normalisation cancels, so earlier cuts do not move this one)."""
    if min_p <= 0:
        ones = torch.ones_like(x, dtype=torch.bool)
        return ones, ones
    gap = x - x.max() - math.log(min_p)
    return gap - 2 * eps >= 0, gap + 2 * eps >= 0
