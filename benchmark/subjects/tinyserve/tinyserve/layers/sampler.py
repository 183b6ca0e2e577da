"""Batched sampler: per-request parameters applied in one tensor pass.

Order: penalties -> temperature (the `sampler.logits` state) -> top-k -> top-p ->
min-p -> softmax (`sampler.probs`, the distribution drawn from) -> draw (greedy
rows: argmax). Random rows draw by the exponential race argmax(p / E), E ~ Exp(1)
from the request's own generator, so a seeded request is reproducible whatever
it is batched with.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class SamplingTensors:
    temperature: torch.Tensor         # [S] (greedy rows hold 1.0)
    greedy: torch.Tensor              # [S] bool
    top_k: torch.Tensor               # [S] int, vocab size when off
    top_p: torch.Tensor               # [S]
    min_p: torch.Tensor               # [S]
    repetition_penalty: torch.Tensor  # [S]
    presence_penalty: torch.Tensor    # [S]
    frequency_penalty: torch.Tensor   # [S]
    prompt_mask: torch.Tensor         # [S, V] bool: token occurs in the prompt
    output_counts: torch.Tensor       # [S, V] int: occurrences in the output so far
    generators: list                  # [S] torch.Generator

    @classmethod
    def build(cls, params: list, prompts: list[list[int]], outputs: list[list[int]], generators: list,
              vocab_size: int) -> "SamplingTensors":
        def col(values, dtype=torch.float32):
            return torch.tensor(values, dtype=dtype)
        s = len(params)
        prompt_mask = torch.zeros(s, vocab_size, dtype=torch.bool)
        output_counts = torch.zeros(s, vocab_size, dtype=torch.int64)
        for i, (prompt, out) in enumerate(zip(prompts, outputs)):
            prompt_mask[i, torch.tensor(prompt, dtype=torch.long)] = True
            if out:
                ids = torch.tensor(out, dtype=torch.long)
                output_counts[i].index_add_(0, ids, torch.ones_like(ids))
        return cls(
            temperature=col([p.temperature if not p.greedy else 1.0 for p in params]),
            greedy=col([p.greedy for p in params], torch.bool),
            top_k=col([p.top_k if p.top_k > 0 else vocab_size for p in params], torch.long).clamp(max=vocab_size),
            top_p=col([p.top_p for p in params]), min_p=col([p.min_p for p in params]),
            repetition_penalty=col([p.repetition_penalty for p in params]),
            presence_penalty=col([p.presence_penalty for p in params]),
            frequency_penalty=col([p.frequency_penalty for p in params]),
            prompt_mask=prompt_mask, output_counts=output_counts, generators=list(generators))


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor   # [S]
    probs: torch.Tensor               # [S, V] distribution the tokens were drawn from


class LogitsAdjuster(nn.Module):
    """logits [S, V] -> penalised, temperature-scaled logits [S, V] (fp32 or wider)."""

    @staticmethod
    def apply_penalties(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        seen = st.prompt_mask | (st.output_counts > 0)
        rep = st.repetition_penalty.to(logits.dtype).unsqueeze(1)
        # HF: positive logits are divided by the penalty, negative ones multiplied
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
        counts = st.output_counts.to(logits.dtype)
        logits = logits - st.frequency_penalty.to(logits.dtype).unsqueeze(1) * counts
        return logits - st.presence_penalty.to(logits.dtype).unsqueeze(1) * (counts > 0).to(logits.dtype)

    @staticmethod
    def apply_temperature(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        return logits / st.temperature.to(logits.dtype).unsqueeze(1)

    def forward(self, logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return self.apply_temperature(self.apply_penalties(logits, st), st)


class Sampler(nn.Module):
    def __init__(self):
        super().__init__()
        self.adjuster = LogitsAdjuster()

    @staticmethod
    def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
        # keep every logit >= the k-th largest (ties at the boundary survive, as in HF)
        sorted_desc = logits.sort(dim=-1, descending=True).values
        kth = sorted_desc.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1))
        return logits.masked_fill(logits < kth, float("-inf"))

    @staticmethod
    def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        # drop the low tail whose total mass is <= 1 - top_p; the top token always survives
        sorted_logits, order = logits.sort(dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - top_p).unsqueeze(1)
        remove_sorted[:, -1] = False
        remove = remove_sorted.scatter(1, order, remove_sorted)
        return logits.masked_fill(remove, float("-inf"))

    @staticmethod
    def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
        probs = logits.softmax(dim=-1)
        threshold = min_p.to(probs.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
        return logits.masked_fill(probs < threshold, float("-inf"))

    @staticmethod
    def draw(probs: torch.Tensor, logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        tokens = logits.argmax(dim=-1)
        for i in (~st.greedy).nonzero().flatten().tolist():
            race = torch.empty_like(probs[i]).exponential_(generator=st.generators[i])
            tokens[i] = (probs[i] / race).argmax()
        return tokens

    def forward(self, logits: torch.Tensor, st: SamplingTensors) -> SamplerOutput:
        logits = self.adjuster(logits, st)
        truncated = logits
        # each filter costs a sort or a softmax over the vocab: skip it when no row uses it
        if bool((st.top_k < logits.shape[-1]).any()):
            truncated = self.apply_top_k(truncated, st.top_k)
        if bool((st.top_p < 1.0).any()):
            truncated = self.apply_top_p(truncated, st.top_p)
        if bool((st.min_p > 0.0).any()):
            truncated = self.apply_min_p(truncated, st.min_p)
        probs = truncated.softmax(dim=-1)
        return SamplerOutput(sampled_token_ids=self.draw(probs, logits, st), probs=probs)


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, top_n: int = 0):
    """Log-probabilities under the raw model distribution (before penalties/temperature).

    -> (chosen [S], top ids [S, n], top logprobs [S, n])
    """
    logprobs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    top = logprobs.topk(top_n, dim=-1) if top_n else None
    return chosen, (top.indices if top else None), (top.values if top else None)
