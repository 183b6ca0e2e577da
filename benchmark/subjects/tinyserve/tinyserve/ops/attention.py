"""Attention over the paged KV cache, for packed (varlen) batches.

Layouts: query [T, H, D] packed by sequence (sequence s owns rows
query_start_loc[s]:query_start_loc[s+1]); key/value cache [num_blocks,
block_size, KVH, D]; block_tables [B, max_blocks]; seq_lens [B] = tokens in
the cache for each sequence *including* this step's. A sequence's query rows are
its last q_len tokens, so row r sits at position seq_len - q_len + r and
attends to cached positions p with p <= its position (causal across chunks) and,
with a sliding window W, p > position - W (as transformers' mask).

Scores are computed in fp32 (or wider), soft-capped as tanh(s / cap) * cap, and
the output is cast back to the query dtype.
"""
from __future__ import annotations

import torch

KV_TILE_TOKENS = 32        # prefill: keys/values visited per online-softmax tile
DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition


def write_to_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter this step's keys/values [T, KVH, D] into their cache slots (block * block_size + offset)."""
    kvh, d = key.shape[1], key.shape[2]
    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value)


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _softcap(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return scores if not softcap else torch.tanh(scores / softcap) * softcap


def _visible(q_pos: torch.Tensor, kv_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    # [..., Q, 1] vs [..., 1, K] -> bool mask of keys each query may attend to
    mask = kv_pos <= q_pos
    if sliding_window is not None:
        mask &= kv_pos > q_pos - sliding_window
    return mask


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Tokens [start, end) of one sequence from the paged cache -> [end - start, KVH, D]."""
    bs = cache.shape[1]
    first, last = start // bs, -(-end // bs)
    blocks = cache.index_select(0, block_table[first:last])
    return blocks.flatten(0, 1)[start - first * bs:end - first * bs]


# ---------------------------------------------------------------- prefill

def _prefill_tile_range(q_start: int, seq_len: int, sliding_window: int | None) -> range:
    """KV tile starts this chunk needs: tiles wholly left of every query's window are skipped."""
    lo = 0 if sliding_window is None else max(0, q_start - sliding_window + 1)
    lo = lo // KV_TILE_TOKENS * KV_TILE_TOKENS
    return range(lo, seq_len, KV_TILE_TOKENS)


def paged_attention_prefill(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                            block_table: torch.Tensor, seq_len: int, scale: float,
                            sliding_window: int | None, softcap: float | None) -> torch.Tensor:
    """One sequence's chunk: online softmax over KV tiles. q [L, H, D] -> [L, H, D]."""
    L, H, D = q.shape
    kvh = key_cache.shape[2]
    qg = q.to(_acc(q.dtype)).view(L, kvh, H // kvh, D).permute(1, 2, 0, 3)   # [KVH, G, L, D]
    q_pos = torch.arange(seq_len - L, seq_len).view(L, 1)
    m = torch.full((kvh, H // kvh, L, 1), float("-inf"), dtype=qg.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros_like(qg)
    for t0 in _prefill_tile_range(seq_len - L, seq_len, sliding_window):
        t1 = min(t0 + KV_TILE_TOKENS, seq_len)
        k = gather_kv(key_cache, block_table, t0, t1).to(qg.dtype).permute(1, 0, 2)   # [KVH, n, D]
        v = gather_kv(value_cache, block_table, t0, t1).to(qg.dtype).permute(1, 0, 2)
        s = _softcap(torch.einsum("kgld,knd->kgln", qg, k) * scale, softcap)
        s = s.masked_fill(~_visible(q_pos, torch.arange(t0, t1).view(1, -1), sliding_window), float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - m_safe)
        correction = torch.exp(m - m_safe)
        l = l * correction + p.sum(-1, keepdim=True)
        acc = acc * correction + torch.einsum("kgln,knd->kgld", p, v)
        m = m_new
    out = acc / l
    return out.permute(2, 0, 1, 3).reshape(L, H, D).to(q.dtype)


# ---------------------------------------------------------------- decode

def _decode_partition(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor, p0: int, part: int,
                      scale: float, sliding_window: int | None, softcap: float | None):
    """One split-KV partition for every decoding sequence.

    q [B, KVH, G, D] -> (out [B, KVH, G, D] normalised within the partition, lse [B, KVH, G])
    """
    bs = key_cache.shape[1]
    blocks = block_tables[:, p0 // bs:(p0 + part) // bs]                              # [B, nb]
    k = key_cache[blocks].flatten(1, 2).to(q.dtype)                                   # [B, P, KVH, D]
    v = value_cache[blocks].flatten(1, 2).to(q.dtype)
    s = _softcap(torch.einsum("bkgd,bpkd->bkgp", q, k) * scale, softcap)
    kv_pos = torch.arange(p0, p0 + k.shape[1]).view(1, -1)
    q_pos = (seq_lens - 1).view(-1, 1)
    visible = _visible(q_pos, kv_pos, sliding_window)                                 # [B, P]
    s = s.masked_fill(~visible[:, None, None, :], float("-inf"))
    m = s.amax(-1, keepdim=True)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe)
    l = p.sum(-1, keepdim=True)
    out = torch.einsum("bkgp,bpkd->bkgd", p, v) / l.clamp_min(torch.finfo(l.dtype).tiny)
    return out, (m_safe + torch.log(l)).squeeze(-1)


def merge_attn_partitions(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """Combine per-partition outputs by their log-sum-exp. [P, ...,D], [P, ...] -> [..., D]."""
    lse = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - lse).nan_to_num(0.0)
    return (weights.unsqueeze(-1) * outs).sum(0)


def paged_attention_decode(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           sliding_window: int | None, softcap: float | None) -> torch.Tensor:
    """One new token per sequence, split-KV. q [B, H, D] -> [B, H, D]."""
    B, H, D = q.shape
    kvh, bs = key_cache.shape[2], key_cache.shape[1]
    part = -(-DECODE_PARTITION_TOKENS // bs) * bs     # whole blocks per partition
    qg = q.to(_acc(q.dtype)).view(B, kvh, H // kvh, D)
    n_parts = -(-int(seq_lens.max()) // part)
    cols = n_parts * part // bs
    tables = torch.zeros(B, cols, dtype=block_tables.dtype)   # pad: padded slots are masked anyway
    width = min(cols, block_tables.shape[1])
    tables[:, :width] = block_tables[:, :width]
    parts = [_decode_partition(qg, key_cache, value_cache, tables, seq_lens, p * part, part,
                               scale, sliding_window, softcap) for p in range(n_parts)]
    out = merge_attn_partitions(torch.stack([o for o, _ in parts]), torch.stack([s for _, s in parts]))
    return out.reshape(B, H, D).to(q.dtype)


# ---------------------------------------------------------------- entry points

def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                    scale: float, sliding_window: int | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """Packed batch: single-token sequences go through the batched decode kernel, the rest
    (prefill chunks) through the tiled prefill kernel. [T, H, D] -> [T, H, D]."""
    out = torch.empty_like(query)
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    decode = (q_lens == 1).nonzero().flatten()
    if decode.numel():
        rows = query_start_loc[decode]
        out[rows] = paged_attention_decode(query[rows], key_cache, value_cache, block_tables[decode],
                                           seq_lens[decode], scale, sliding_window, softcap)
    for s in (q_lens > 1).nonzero().flatten().tolist():
        a, b = int(query_start_loc[s]), int(query_start_loc[s + 1])
        out[a:b] = paged_attention_prefill(query[a:b], key_cache, value_cache, block_tables[s],
                                           int(seq_lens[s]), scale, sliding_window, softcap)
    return out


def paged_attention_native(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                           scale: float, sliding_window: int | None = None,
                           softcap: float | None = None) -> torch.Tensor:
    """Per sequence: gather its whole context, full masked softmax. [T, H, D] -> [T, H, D]."""
    out = torch.empty_like(query)
    H = query.shape[1]
    for s in range(seq_lens.shape[0]):
        a, b, n = int(query_start_loc[s]), int(query_start_loc[s + 1]), int(seq_lens[s])
        k = gather_kv(key_cache, block_tables[s], 0, n)
        v = gather_kv(value_cache, block_tables[s], 0, n)
        rep = H // k.shape[1]
        k = k.repeat_interleave(rep, dim=1).to(_acc(query.dtype))     # [n, H, D]
        v = v.repeat_interleave(rep, dim=1).to(_acc(query.dtype))
        q = query[a:b].to(_acc(query.dtype))                          # [L, H, D]
        scores = _softcap(torch.einsum("lhd,nhd->hln", q, k) * scale, softcap)
        q_pos = torch.arange(n - (b - a), n).view(-1, 1)
        scores = scores.masked_fill(~_visible(q_pos, torch.arange(n).view(1, -1), sliding_window), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[a:b] = torch.einsum("hln,nhd->lhd", probs, v).to(query.dtype)
    return out
