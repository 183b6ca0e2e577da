"""Rejection sampling over verification rows.

A speculated sequence contributes k+1 consecutive rows: row r scores the token at
the next position given the context plus drafts d_1..d_r. Drafts are point masses,
so draft x is accepted with probability p(x) (greedy: iff x is the argmax); on a
rejection the token is drawn from p with x removed, renormalised. Then
P(emit y) = p(y) for every y: the target distribution is kept exactly. The row
after the last accepted draft emits its own sample (the bonus token).
"""
from __future__ import annotations

import torch

from tinyserve.layers.sampler import Sampler, SamplerOutput, SamplingTensors


def accept_or_resample(probs: torch.Tensor, draft: int, generator: torch.Generator) -> int:
    """One random row: -> draft if accepted, else a draw from the residual distribution."""
    u = torch.rand((), generator=generator, dtype=probs.dtype)
    if u < probs[draft]:
        return draft
    residual = probs.clone()
    residual[draft] = 0.0
    if not bool(residual.sum() > 0):     # p(draft) == 1 and u hit the boundary: nothing else is possible
        return draft
    race = torch.empty_like(residual).exponential_(generator=generator)
    return int((residual / race).argmax())


class RejectionSampler(Sampler):
    """logits [R, V], per-row sampling tensors, draft [R] (-1 where the row verifies nothing)
    -> per-row tokens: the draft where accepted, the resampled token where rejected,
    the row's own sample elsewhere (rows after a rejection are meaningless)."""

    def forward(self, logits: torch.Tensor, st: SamplingTensors, drafts: torch.Tensor | None = None) -> SamplerOutput:
        out = super().forward(logits, st)
        if drafts is None:
            return out
        tokens = out.sampled_token_ids.clone()
        for r in (drafts >= 0).nonzero().flatten().tolist():
            if not bool(st.greedy[r]):    # greedy rows already hold the argmax: accepted iff it equals the draft
                tokens[r] = accept_or_resample(out.probs[r], int(drafts[r]), st.generators[r])
        return SamplerOutput(sampled_token_ids=tokens, probs=out.probs)
