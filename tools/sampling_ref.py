"""Reference sampler transforms, for the `sampler.*` taps of a teacher-forced run.

Definitions (applied in this order, as transformers and vLLM do):
repetition penalty over prompt + output so far (divide positive logits, multiply
negative ones); presence / frequency penalties over output tokens so far
(OpenAI definition: logit -= presence * [count > 0] + frequency * count);
temperature; top-k; top-p (smallest set whose mass reaches p); min-p (drop tokens
whose probability is below min_p * max probability). Masked entries are -inf.
"""
from __future__ import annotations

import torch


def processed_logits(logits: torch.Tensor, seq: list[int], n_prompt: int, sampling: dict):
    """[P, V] logits at the sampled positions n_prompt-1 … -> ([P, V] after penalties and temperature
    (the `sampler.logits` tap), [P, V] after top-k / top-p / min-p as well (what `sampler.probs` uses))."""
    adjusted, truncated = [], []
    for i in range(logits.shape[0]):
        p = n_prompt - 1 + i
        x = adjust_row(logits[i], seq[:p + 1], seq[n_prompt:p + 1], sampling)
        adjusted.append(x)
        truncated.append(truncate_row(x, sampling))
    return torch.stack(adjusted), torch.stack(truncated)


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
    drop_sorted = (cum - torch.softmax(sorted_x, -1)) >= p     # mass before this token already reaches p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return x.masked_fill(drop, float("-inf"))


def min_p_mask(x: torch.Tensor, min_p: float) -> torch.Tensor:
    if min_p <= 0:
        return x
    probs = torch.softmax(x, -1)
    return x.masked_fill(probs < min_p * probs.max(), float("-inf"))
