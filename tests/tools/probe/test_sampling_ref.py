"""Kept-set bounds of the reference sampler: exact without a margin, sound with one (issue 16)."""

import math

import torch

from tools.probe.sampling_ref import adjust_row, kept_bounds, min_p_bounds, processed_logits, top_k_bounds, truncate_row


def random_cases(n: int, vocab: int = 64, seed: int = 0):
    """Seeded (logits [V], sampling params) pairs spanning peaked and flat rows and every cut."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        scale = float(torch.rand(1, generator=g)) * 4 + 0.1
        x = torch.randn(vocab, generator=g, dtype=torch.float64) * scale
        s = {
            "top_k": int(torch.randint(0, vocab + 4, (1,), generator=g)),
            "top_p": float(torch.rand(1, generator=g)),
            "min_p": float(torch.rand(1, generator=g)) * 0.3,
        }
        yield x, s, g


def test_without_a_margin_the_bounds_are_the_reference_kept_set():
    for x, s, _ in random_cases(300):
        kept = torch.isfinite(truncate_row(x, s))
        sure, maybe = kept_bounds(x, s, 0.0)
        assert torch.equal(sure, kept) and torch.equal(maybe, kept), s


def test_every_perturbation_within_the_margin_keeps_a_set_between_the_bounds():
    eps = 0.05
    for x, s, g in random_cases(200, seed=1):
        sure, maybe = kept_bounds(x, s, eps)
        for _ in range(5):
            noisy = x + (torch.rand(x.shape, generator=g, dtype=torch.float64) * 2 - 1) * eps
            kept = torch.isfinite(truncate_row(noisy, s))
            assert bool((sure <= kept).all()) and bool((kept <= maybe).all()), s


def test_a_token_near_the_min_p_cut_is_undecided_and_far_ones_are_decided():
    cut = math.log(0.1)
    x = torch.tensor([0.0, cut + 1e-3, cut - 1e-3, cut + 1.0, cut - 1.0], dtype=torch.float64)
    sure, maybe = min_p_bounds(x, 0.1, eps=1e-2)
    assert sure.tolist() == [True, False, False, True, False]
    assert maybe.tolist() == [True, True, True, True, False]


def test_top_k_keeps_ties_at_the_boundary_and_margins_them():
    x = torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=torch.float64)
    sure, maybe = top_k_bounds(x, 2, eps=0.0)
    assert sure.tolist() == [True, True, True, False] == maybe.tolist()
    sure, maybe = top_k_bounds(x, 2, eps=0.1)
    assert sure.tolist() == [True, False, False, False] and maybe.tolist() == [True, True, True, False]


def test_the_best_token_always_survives_top_p():
    x = torch.tensor([5.0, 0.0, 0.0], dtype=torch.float64)
    sure, _ = kept_bounds(x, {"top_p": 0.01}, eps=1.0)
    assert sure.tolist() == [True, False, False]


def test_processed_logits_equal_their_rows_definition_and_copy_nothing_when_nothing_changes():
    """Issue 14, probe cost: `processed_logits` is each row through `adjust_row` then `truncate_row`, stacked; a
    greedy request without penalties changes no row, and then its answer is its input (no vocabulary-wide copy),
    and the cut is left out when not asked for."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 50, generator=g, dtype=torch.float64)
    seq, n_prompt = [int(t) for t in torch.randint(0, 50, (10,), generator=g)], 4
    samplings = (
        {},
        {"temperature": 0.7},
        {"top_k": 5, "top_p": 0.8, "min_p": 0.05, "temperature": 1.3},
        {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.2},
    )
    for s in samplings:
        adjusted = [adjust_row(logits[i], seq[: n_prompt + i], seq[n_prompt : n_prompt + i], s) for i in range(6)]
        processed, truncated = processed_logits(logits, seq, n_prompt, s)
        assert torch.equal(processed, torch.stack(adjusted)), s
        assert torch.equal(truncated, torch.stack([truncate_row(x, s) for x in adjusted])), s
        alone, none = processed_logits(logits, seq, n_prompt, s, truncated=False)
        assert torch.equal(alone, processed) and none is None, s
    greedy, cut = processed_logits(logits, seq, n_prompt, {})
    assert greedy is logits and cut is logits
