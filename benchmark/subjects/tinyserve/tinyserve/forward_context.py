"""Per-forward metadata, visible to every layer of the model while it runs.

The model runner sets it around each forward (`set_forward_context`); attention
layers read their paged-cache metadata from it, and observers (forward hooks)
read which sequence and position each packed row belongs to.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor   # [B+1] packed-row offsets per scheduled sequence
    seq_lens: torch.Tensor          # [B] tokens in the cache after this step, per sequence
    block_tables: torch.Tensor      # [B, max_blocks] physical block ids (padded with 0)
    slot_mapping: torch.Tensor      # [T] cache slot (block * block_size + offset) of each new token


@dataclass
class ForwardContext:
    step: int                       # engine step that runs this forward
    attn_metadata: AttentionMetadata
    request_ids: list[str]          # per scheduled sequence, in batch order
    row_seq_index: torch.Tensor     # [T] which scheduled sequence each packed row belongs to
    positions: torch.Tensor         # [T] token position of each packed row
    logits_indices: torch.Tensor    # [S] packed rows whose logits are computed (sequences that sample)
    sample_seq_index: torch.Tensor  # [S] scheduled-sequence index of each sampled row


_forward_context: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    if _forward_context is None:
        raise RuntimeError("no forward in progress: get_forward_context() is only valid inside a model forward")
    return _forward_context


@contextmanager
def set_forward_context(ctx: ForwardContext):
    global _forward_context
    previous, _forward_context = _forward_context, ctx
    try:
        yield ctx
    finally:
        _forward_context = previous
