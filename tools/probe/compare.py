"""Robust error ratio, first divergence, and where it happens (docs/design.md §3). Pure.

For a tap: Y = reference at high precision, R = reference at the target's dtype,
T = target. Per row: err_T = ||T-Y||/||Y||, err_R = ||R-Y||/||Y||,
ratio = err_T / max(err_R, floor[dtype]). A correct implementation sits near 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from tools.probe import taps as tapnames
from tools.probe.align import Aligned

# Harmless relative noise of a correct implementation in each dtype (summation order,
# fused kernels, different rounding points). Calibrated so the bug-free subjects show zero
# divergent taps on every supported config (tests/tools/test_no_false_alarms.py).
NOISE_FLOOR = {"float64": 1e-10, "float32": 2e-5, "float16": 1e-3, "bfloat16": 8e-3}
# A greedy token counts as wrong only when it loses to the best by more than this many logits:
# near-ties legitimately flip under each dtype's noise.
TOKEN_MARGIN = {"float64": 1e-6, "float32": 1e-3, "float16": 5e-2, "bfloat16": 2e-1}
THRESHOLD = 4.0  # ratio above which a row diverges
# A tap whose rows over THRESHOLD are a few outliers among those it compares is noise: the ratio divides
# two draws of a correct implementation's noise, and where that noise sits on a few directions (a residual
# error a later weight row amplifies: an MLP channel, a few large logits) one draw says little of its
# scale, so over the ~1e5 rows a real model's probe compares some rows part by more than THRESHOLD.
# Bug-free SmolLM2-135M in bf16, 2 x 128 tokens: at most 2 of a tap's 256-289 rows, ratios up to 10.1
# (docs/design.md §3). A bug shows on more rows (OUTLIER_SHARE), stands further out (OUTLIER_RATIO: an
# activation scaled by 0.7 on one row reaches 35), or is not finite.
OUTLIER_RATIO = 16.0
OUTLIER_SHARE = 1 / 32
# A trace's rows need no digit whose rounding is below this share of the compare's noise floor.
STORED_DIGITS_MARGIN = 1e-4
NONFINITE_ERROR = 1.0  # relative error charged to a row whose inf/nan pattern differs


@dataclass(slots=True)  # one per tap and request: a deep model's compare returns thousands
class TapStat:
    """One tap of one request, compared: what the pipeline reads of its rows, in a size that does not
    grow with them (so the compare's result does not grow with a model's depth but by a few scalars a
    tap): the ratio's maximum, and where the rows over THRESHOLD are (their distinct positions and
    steps, as runs of consecutive values). Built from the rows by `summarize`."""

    tap: str
    request: int
    rows: int  # rows compared
    max_ratio: float  # 0.0 without rows
    first_step: int  # the earliest step of any row (0 without rows)
    over_positions: tuple[range, ...]  # distinct positions of the rows over THRESHOLD, as sorted runs
    over_steps: tuple[range, ...]  # distinct steps of the rows over THRESHOLD, as sorted runs
    nonfinite: bool = False  # the target has inf/nan where the reference does not
    outliers: bool = False  # its tap's rows over THRESHOLD are a few noise outliers (`mark_outliers`)

    @property
    def diverges(self) -> bool:
        """A row over THRESHOLD, and they are not a few outliers of the noise."""
        return bool(self.over_positions) and not self.outliers

    @property
    def crosses(self) -> bool:
        """A row over THRESHOLD, outlier or not: what carries a divergence downstream (`_is_real`)."""
        return bool(self.over_positions)


def summarize(
    tap: str, request: int, positions: list[int], steps: list[int], ratio: torch.Tensor, nonfinite: bool = False
) -> TapStat:
    """[P] positions, steps and ratios of a tap's rows -> its TapStat."""
    over = torch.nonzero(ratio > THRESHOLD).flatten().tolist()
    return TapStat(
        tap,
        request,
        len(positions),
        float(ratio.max()) if len(positions) else 0.0,
        min(steps, default=0),
        runs(positions[i] for i in over),
        runs(steps[i] for i in over),
        nonfinite,
    )


def runs(values: Iterable[int]) -> tuple[range, ...]:
    """Integers -> their distinct values as sorted runs of consecutive ones: [5, 1, 2, 2, 3] -> (1-3, 5)."""
    out: list[range] = []
    for v in sorted(set(values)):
        if out and out[-1].stop == v:
            out[-1] = range(out[-1].start, v + 1)
        else:
            out.append(range(v, v + 1))
    return tuple(out)


@dataclass
class Divergence:
    tap: str
    step: int
    requests: list[int]
    positions: list[int]
    steps: list[int]
    ratio: float
    nonfinite: bool = False
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "tap": self.tap,
            "step": self.step,
            "requests": self.requests,
            "positions": self.positions,
            "ratio": round(self.ratio, 3),
        }


def all_finite(x: torch.Tensor) -> bool:
    """Every entry of `x` is finite (`bool(torch.isfinite(x).all())`), by one sum, into which any inf or
    nan carries; only when the sum is not finite (such an entry, or finite ones summing past the dtype's
    range) by the element-wise test. On CPU the sum is a vectorized pass and `isfinite` is not: on a
    deep model's taps the finiteness tests cost more than the errors they guard."""
    return bool(torch.isfinite(x.sum())) or bool(torch.isfinite(x).all())


def stored_precision(compared_in: str) -> torch.dtype:
    """The narrowest float dtype whose rounding (half an ulp, relative) is negligible next to the noise
    floor of a compare in `compared_in`: float32 for the 16-bit dtypes (6e-8 against floors of 1e-3 and
    more), float64 for float32 and float64. A high-precision reference's float64 rows judged against a
    bf16 target were half of a probe's trace bytes, with four orders of magnitude of digits unused."""
    for dtype in (torch.float32, torch.float64):
        if torch.finfo(dtype).eps / 2 <= STORED_DIGITS_MARGIN * NOISE_FLOOR[compared_in]:
            return dtype
    return torch.float64


def row_errors(
    x: torch.Tensor, y: torch.Tensor, precision: torch.dtype = torch.float64, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[P, F] x, y -> ([P] relative error, [P] nonfinite mismatch), over the finite part of y, computed in
    `precision` (`stored_precision` of the dtype compared: float32 under a 16-bit floor, whose rounding
    there is 1e-4 of the floor and below; float64 otherwise). `scale`: `y.norm(dim=-1)` in `precision`,
    when the caller has it (two errors against one reference)."""
    y = y.to(precision)  # no copy when already in it
    # a narrower x is widened exactly inside the subtraction (the same values, one pass fewer)
    fast = _all_finite_errors(x if torch.promote_types(x.dtype, precision) == precision else x.to(precision), y, scale)
    if fast is not None:
        return fast
    x = x.to(precision)
    fin_y, fin_x = torch.isfinite(y), torch.isfinite(x)
    mismatch = (fin_x != fin_y).any(-1)
    both = fin_x & fin_y
    diff = torch.where(both, x - y, torch.zeros_like(y))
    ref = torch.where(fin_y, y, torch.zeros_like(y))
    scale = ref.norm(dim=-1)
    tiny = 1e-6 * scale.mean().clamp_min(1e-30)  # rows that are ~0 in the reference
    err = diff.norm(dim=-1) / torch.maximum(scale, tiny)
    return torch.where(mismatch, torch.maximum(err, torch.full_like(err, NONFINITE_ERROR)), err), mismatch


def _all_finite_errors(
    x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`row_errors` of [P, F] x, y (x no wider than y's dtype, in which it is computed) when both are finite
    everywhere (the norms are finite only then), by the same arithmetic; None otherwise. Four passes over the
    rows instead of a dozen: on a deep model's taps the masks cost more than the errors. `scale`: y's row norms."""
    diff, scale = (x - y).norm(dim=-1), y.norm(dim=-1) if scale is None else scale
    if not bool(torch.isfinite(diff).all() and torch.isfinite(scale).all()):
        return None
    tiny = 1e-6 * scale.mean().clamp_min(1e-30)
    return diff / torch.maximum(scale, tiny), torch.zeros_like(scale, dtype=torch.bool)


def robust_ratio(t: torch.Tensor, r: torch.Tensor, y: torch.Tensor, floor: float, precision=torch.float64):
    """[P, F] target, reference-at-dtype, high-precision reference -> ([P] ratio, err_t, err_r, nonfinite),
    the errors computed in `precision` (`row_errors`); the ratio in float64."""
    y = y.to(precision)
    scale = y.norm(dim=-1)  # both errors are relative to the same rows: their norms once
    err_t, bad_t = row_errors(t, y, precision, scale)
    err_r, _ = row_errors(r, y, precision, scale)
    err_t, err_r = err_t.double(), err_r.double()
    return err_t / err_r.clamp_min(floor), err_t, err_r, bool(bad_t.any())


# Taps where engines may legitimately mask different entries with -inf (transformers reports its
# logits after top-k/top-p, vLLM-style engines before): compared on the entries finite in both;
# truncation itself is judged on `sampler.probs`.
MASK_TOLERANT = ("sampler.logits",)
# Taps judged as sampling (kept sets, see `kept_set_error`), not by a per-element error ratio: a
# token near a top-k / top-p / min-p cut flips in or out under any rounding noise.
SAMPLING_JUDGED = ("sampler.probs", "sampler.token")
# Logit noise of a sampler's own arithmetic (fp32 softmax / cumsum over the vocab), and the floor
# of its probabilities' relative error: engines run the sampler in fp32 whatever the model dtype.
SAMPLER_EPS = 1e-4
SAMPLER_FLOOR = NOISE_FLOOR["float32"]
# A token this improbable under the loosest kept set cannot be told kept from dropped by sampling.
PROB_FLOOR = 1e-9


def common_finite(t: torch.Tensor, r: torch.Tensor, y: torch.Tensor, precision=torch.float64):
    """Blank (to 0) every entry that is not finite in all three, so only the shared part compares; the
    three as they are when all is finite (a vocabulary-wide tap: three masks and copies saved)."""
    if all_finite(t) and all_finite(r) and all_finite(y):
        return t, r, y
    keep = torch.isfinite(t) & torch.isfinite(r) & torch.isfinite(y)
    return tuple(torch.where(keep, x.to(precision), torch.zeros((), dtype=precision)) for x in (t, r, y))


def tap_stats(aligned: Iterable[Aligned], dtype: str) -> list[TapStat]:
    """Ratio statistics of the taps compared element-wise (the sampling-judged ones are skipped); one
    tap at a time, so a lazy `aligned` (align.iter_aligned) is never held whole."""
    floor, precision = NOISE_FLOOR[dtype], stored_precision(dtype)
    stats = []
    for a in aligned:
        if a.tap in SAMPLING_JUDGED:
            continue
        t, r, y = common_finite(a.t, a.r, a.y, precision) if a.tap in MASK_TOLERANT else (a.t, a.r, a.y)
        ratio, _, _, nonfinite = robust_ratio(t, r, y, floor, precision)
        stats.append(summarize(a.tap, a.request, a.positions, a.steps, ratio, nonfinite))
    return mark_outliers(stats)


def mark_outliers(stats: list[TapStat]) -> list[TapStat]:
    """Mark the stats of each tap whose rows over THRESHOLD, over all its requests, are outliers of the
    noise: one row, or no more than OUTLIER_SHARE of the rows it compared, all finite and under
    OUTLIER_RATIO. They are no divergence of their own, but still crossings that carry an earlier
    divergence downstream."""
    by_tap: dict[str, list[TapStat]] = {}
    for s in stats:
        by_tap.setdefault(s.tap, []).append(s)
    for group in by_tap.values():
        over = [s for s in group if s.over_positions]
        count = sum(len(run) for s in over for run in s.over_positions)
        few = count <= max(1.0, OUTLIER_SHARE * sum(s.rows for s in group))
        if over and few and all(not s.nonfinite and s.max_ratio < OUTLIER_RATIO for s in over):
            for s in over:
                s.outliers = True
    return stats


def kept_set_error(t_probs: torch.Tensor, x: torch.Tensor, sure: torch.Tensor, maybe: torch.Tensor):
    """One sampled row, judged as sampling: [V] target probabilities, [V] the sampler input they came
    from (after penalties / temperature), [V] bool kept bounds of the reference sampler on that input
    -> (error, number of tokens kept or dropped against the reference beyond its noise margin).

    The reference distribution is the softmax of `x` over the surely kept tokens plus the undecided
    ones the target kept; error = relative L2 distance to it + the share of decided mismatches
    (each a logic difference in the cut, however small its mass). 0 for a correct sampler."""
    x, t = x.double(), t_probs.double()
    if not all_finite(t):
        return NONFINITE_ERROR, 0
    t_kept = t > 0
    loose = torch.softmax(x.masked_fill(~maybe, float("-inf")), -1)
    observable = loose > PROB_FLOOR
    wrong = ((t_kept & ~maybe & (t > PROB_FLOOR)) | (~t_kept & sure & observable)).sum()
    keep = sure | (maybe & t_kept)
    s = torch.softmax(x.masked_fill(~keep, float("-inf")), -1)
    err = float((t - s).norm() / s.norm()) + float(wrong) / max(1, int(keep.sum()))
    return err, int(wrong)


def sampling_stat(
    tap: str, request: int, positions: list[int], steps: list[int], errors: list[float], nonfinite: bool = False
) -> TapStat:
    """Per-row sampling errors (`kept_set_error`, or 0/1 for a token outside the kept set) as a TapStat
    whose ratio is measured against the sampler's own noise floor."""
    err = torch.tensor(errors, dtype=torch.float64)
    return summarize(tap, request, positions, steps, err / SAMPLER_FLOOR, nonfinite)


def first_divergence(stats: list[TapStat]) -> Divergence | None:
    """Earliest tap (step, then execution order) whose divergence is real, or None."""
    for stat in _candidates(stats):
        if _is_real(stat, stats):
            return _describe(stat.tap, stat.over_steps[0].start, stats)
    return None


def _candidates(stats: list[TapStat]) -> list[TapStat]:
    """The diverging stats by their first step over THRESHOLD, then execution order, then request."""
    over = [s for s in stats if s.diverges]
    return sorted(over, key=lambda s: (s.over_steps[0].start, tapnames.order_key(s.tap), s.request))


def _is_real(stat: TapStat, stats: list[TapStat]) -> bool:
    """Real = stays elevated on the residual stream downstream, or reaches the output."""
    if tapnames.split(stat.tap)[1] in tapnames.OUTPUT_TAPS:
        return True
    first_pos = stat.over_positions[0].start
    later = [s for s in stats if s.request == stat.request and tapnames.order_key(s.tap) > tapnames.order_key(stat.tap)]
    for s in later:
        if s.tap in _stream_taps(stat.tap) or tapnames.split(s.tap)[1] in tapnames.OUTPUT_TAPS:
            if s.crosses and s.over_positions[-1].stop - 1 >= first_pos:
                return True
    return False


def _stream_taps(tap: str) -> set[str]:
    """Residual-stream taps that carry a divergence at `tap` forward."""
    layer, _ = tapnames.split(tap)
    if layer is None:
        return {"layers.0.resid_mid", "layers.0.out", "final_norm"}
    return {
        f"layers.{layer}.resid_mid",
        f"layers.{layer}.out",
        f"layers.{layer + 1}.out",
        f"layers.{layer + 1}.resid_mid",
        "final_norm",
    }


def _describe(tap: str, step: int, stats: list[TapStat]) -> Divergence:
    positions: set[int] = set()
    steps: set[int] = set()
    requests, ratio, nonfinite = [], 0.0, False
    for s in stats:
        if s.tap != tap or not s.diverges:
            continue
        requests.append(s.request)
        positions.update(p for run in s.over_positions for p in run)
        steps.update(p for run in s.over_steps for p in run)
        ratio = max(ratio, s.max_ratio)  # the rows over THRESHOLD hold the maximum
        nonfinite = nonfinite or s.nonfinite
    return Divergence(tap, step, sorted(set(requests)), sorted(positions), sorted(steps), ratio, nonfinite)


def layer_key(tap: str) -> str:
    """The row of the layer table a tap falls in: its layer, or the embed / head tap itself."""
    layer, name = tapnames.split(tap)
    return f"layers.{layer}" if layer is not None else name


def layer_table(stats: list[TapStat]) -> list[tuple[str, float]]:
    """Max ratio per layer (and for the embed / head taps), in execution order."""
    table: dict[str, float] = {}
    for s in sorted(stats, key=lambda s: tapnames.order_key(s.tap)):
        key = layer_key(s.tap)
        table[key] = max(table.get(key, 0.0), s.max_ratio)
    return list(table.items())


def divergent_taps(stats: list[TapStat]) -> list[str]:
    return sorted({s.tap for s in stats if s.diverges}, key=tapnames.order_key)


def token_divergence(
    target_seq: list[int], n_prompt: int, high_logits: torch.Tensor, positions: list[int], margin: float
) -> int | None:
    """First generated position whose greedy target token loses to another by more than `margin` logits.

    high_logits [P, V] of the high-precision reference at `positions`; returns a token position or None.
    """
    for row, p in enumerate(positions):
        if n_prompt - 1 <= p < len(target_seq) - 1:
            x = high_logits[row].double()
            if float(x.max() - x[target_seq[p + 1]]) > margin:
                return p + 1
    return None


def compress(values: list[int]) -> str:
    """[0,1,2,5,6] -> '0-2, 5-6'."""
    if not values:
        return "-"
    parts, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)
