"""Function contracts: what a function of a known role must compute from its own inputs.

With no history to restore (a bug at base), a function is judged on its own: its recorded inputs
go through an fp64 recomputation of the rule its role implies (RMSNorm, a gated activation,
soft-capping, a rotary table or rotation, a mask, a top-k / top-p / min-p cut, a penalty, a weight
quantizer's round trip, a config reader's fidelity to the file) and its recorded output is compared
with it. Roles are recognised from the function's name and parameter names only (the vocabulary serving engines share: `weight`, `eps`,
`inv_freq`, `positions`, `sliding_window`, `top_k`, …), never from an engine's module layout.

A check returns the violation size in the units of its tolerance (relative error, or the share of
mask entries that disagree), or None when the recorded call does not fit the role after all
(unexpected shapes, a value it cannot read): such a call is not judged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tools.engines.functaps import ModuleWeights
from tools.probe import sampling_ref
from tools.probe.compare import NOISE_FLOOR, THRESHOLD, robust_ratio
from tools.refmodels import rope as rope_ref

# Relative error a correct implementation stays under, by the dtype of its output: a few
# roundings of that dtype, far below what a wrong formula gives (a dropped term, a swapped
# convention: 1e-3 and up even in float32).
TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@dataclass(frozen=True)
class Contract:
    name: str  # e.g. "rms-norm"
    component: str  # the tap component it belongs to (tools.probe.taps.component)
    rule: str  # one line: what the function must compute
    applies: Callable[[str, tuple[str, ...]], bool]  # (function name, parameter names) -> is it this role
    check: (
        Callable[[dict, object, dict], float | None] | None
    )  # (inputs, output, context) -> violation size; None: bound per function name in contract_check
    tolerance: Callable[[object], float]  # output -> the size a correct implementation stays under
    judges_writes: bool = False  # its output is what it wrote in place (FunctionCall.writes), not its result
    judges_attributes: bool = False  # its output is the returned object's attributes (FunctionCall.attributes)


# ---------------------------------------------------------------- shared numerics


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:  # [...] vs [...] -> ||got - want|| / ||want||
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def first_tensor(inputs: dict) -> torch.Tensor | None:
    return next((v for v in inputs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()), None)


def out_tensor(output) -> torch.Tensor | None:
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    return output if isinstance(output, torch.Tensor) and output.is_floating_point() else None


def dtype_tolerance(output) -> float:
    t = out_tensor(output)
    return TOLERANCE.get(t.dtype, 1e-5) if t is not None else 1e-5


def param(inputs: dict, *words: str):
    """The first input whose parameter name contains one of `words` (None if none does)."""
    return next((v for k, v in inputs.items() if any(w in k.lower() for w in words)), None)


def has(params: tuple[str, ...], *words: str) -> bool:
    return any(w in p.lower() for p in params for w in words)


# ---------------------------------------------------------------- norms and activations


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    # [T, H], [H] -> [T, H] fp64: x / sqrt(mean(x^2) + eps) * (offset + w)
    x = x.double()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * (offset + weight.double())


def check_rms_norm(inputs: dict, output, _ctx: dict) -> float | None:
    x, weight, eps = first_tensor(inputs), param(inputs, "weight"), param(inputs, "eps", "epsilon")
    got = out_tensor(output)
    if x is None or not isinstance(weight, torch.Tensor) or not isinstance(eps, (int, float)) or got is None:
        return None
    residual = param(inputs, "residual")
    if isinstance(residual, torch.Tensor):
        x = x.double() + residual.double()
    offset = param(inputs, "offset")
    want = rms_norm_ref(x, weight, float(eps), float(offset or 0.0))
    if got.shape != want.shape:
        return None
    err = rel_err(got, want)
    if isinstance(residual, torch.Tensor) and isinstance(output, (tuple, list)) and len(output) == 2:
        new_residual = output[1]
        if isinstance(new_residual, torch.Tensor) and new_residual.shape == x.shape:
            err = max(err, rel_err(new_residual, x))
    return err


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:  # fp64 elementwise
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def activation_for(name: str) -> list[Callable]:
    """The activations a function's name allows: 'gelu_tanh' is the tanh form only, a bare 'gelu'
    either form (engines differ on what the plain name means)."""
    name = name.lower()
    if "silu" in name or "swiglu" in name:
        return [silu]
    if "gelu" in name:
        return [gelu_tanh] if "tanh" in name or "new" in name or "fast" in name else [gelu_tanh, gelu_erf]
    return []


def check_gated_activation(name: str):
    def check(inputs: dict, output, _ctx: dict) -> float | None:
        x, got = first_tensor(inputs), out_tensor(output)
        if x is None or got is None or x.shape[-1] != 2 * got.shape[-1]:
            return None
        gate, up = x.double().chunk(2, dim=-1)  # [T, I] each: the fused [gate | up] layout
        return min(rel_err(got, act(gate) * up) for act in activation_for(name))

    return check


def is_gated_activation(name: str, params: tuple[str, ...]) -> bool:
    n = name.lower()
    return bool(activation_for(n)) and ("mul" in n or "and" in n or "glu" in n) and len(params) <= 2


# ---------------------------------------------------------------- soft-capping, masks


def check_softcap(inputs: dict, output, _ctx: dict) -> float | None:
    x, got = first_tensor(inputs), out_tensor(output)
    cap = param(inputs, "cap")
    if x is None or got is None or got.shape != x.shape or not (cap is None or isinstance(cap, (int, float))):
        return None
    want = x.double() if not cap else torch.tanh(x.double() / cap) * cap
    return rel_err(got, want)


def is_softcap(name: str, params: tuple[str, ...]) -> bool:
    n = name.lower()
    return ("softcap" in n or "soft_cap" in n) and has(params, "cap") and len(params) == 2


def visible_ref(q_pos: torch.Tensor, kv_pos: torch.Tensor, window) -> torch.Tensor:
    """Causal (key at or before the query) and, with a window W, within the last W positions:
    kv <= q and kv > q - W (transformers' sliding-window rule)."""
    mask = kv_pos <= q_pos
    return mask & (kv_pos > q_pos - window) if window is not None else mask


def check_mask(inputs: dict, output, _ctx: dict) -> float | None:
    q_pos, kv_pos = param(inputs, "q_pos", "query_pos", "qpos"), param(inputs, "kv_pos", "key_pos", "kpos")
    window = param(inputs, "window")
    if not isinstance(q_pos, torch.Tensor) or not isinstance(kv_pos, torch.Tensor):
        return None
    if not isinstance(output, torch.Tensor) or output.dtype != torch.bool:
        return None
    want = visible_ref(q_pos, kv_pos, window if isinstance(window, int) else None)
    if want.shape != output.shape:
        return None
    return float((want != output).double().mean())


def is_mask(name: str, params: tuple[str, ...]) -> bool:
    n = name.lower()
    return ("mask" in n or "visible" in n) and has(params, "q_pos", "query_pos", "qpos") and has(params, "kv_pos")


# ---------------------------------------------------------------- 4D attention masks and their builders
#
# A mask builder returns the mask the attention adds to its scores: [B, 1|H, Q, K], additive (0 where a
# key is visible, a large negative where not) or boolean (True: visible), or None when the attention
# applies the plain causal rule itself (an SDPA-style is_causal: no window, no padding). From the
# builder's own inputs the mask is computable in closed form: the query positions (a cache position, or
# a past length plus the query count), the padding mask [B, K'] (1: a real token) and the window. The
# window is the builder's own window argument when it is given one; otherwise the one the model's
# layers use, as the engine adapter reads it from the model's config (context "attention_windows": one
# window per layer, None for full attention; "masks_per_layer_kind": the tree builds one mask per kind
# of layer). A builder named for the window builds the sliding layers' mask; one mask shared by every
# layer carries the window only when every layer has it.

POSITION_WORDS = ("cache_position", "past_key_values_length", "past_length", "past_seen")
WINDOW_NAME_WORDS = ("sliding", "window", "local")


def is_mask_builder(name: str, params: tuple[str, ...]) -> bool:
    return (
        "mask" in name.lower()
        and has(params, "attention_mask", "padding_mask", "shape")
        and has(params, *POSITION_WORDS)
        and not has(params, "q_pos", "query_pos", "qpos")
    )


def expected_window(name: str, inputs: dict, ctx: dict) -> tuple[bool, int | None]:
    """(known, window) the builder's mask must carry; unknown when neither its inputs nor the context say."""
    own = param(inputs, "sliding_window", "window")
    if isinstance(own, int) and not isinstance(own, bool):
        return True, own
    layers = ctx.get("attention_windows")
    if not layers:
        return False, None
    slides = {w for w in layers if w is not None}
    if any(w in name.lower() for w in WINDOW_NAME_WORDS):
        return (True, slides.pop()) if len(slides) == 1 else (False, None)
    if len(set(layers)) == 1 and not ctx.get("masks_per_layer_kind"):
        return True, layers[0]
    return True, None  # a mask for the full-attention layers (the sliding ones get or make their own)


def mask_geometry(inputs: dict, output) -> tuple[int, torch.Tensor] | None:
    """(batch, query positions [Q]) of a builder's call, from its output and its position inputs."""
    embeds = next((v for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim() == 3), None)
    shape = param(inputs, "input_shape", "input_ids_shape")
    cache_position = param(inputs, "cache_position")
    if isinstance(output, torch.Tensor):
        batch, q_len = output.shape[0], output.shape[-2]
    elif isinstance(cache_position, torch.Tensor):
        q_len = cache_position.numel()
        batch = embeds.shape[0] if embeds is not None else (shape[0] if isinstance(shape, (tuple, list)) else 1)
    elif isinstance(shape, (tuple, list)) and len(shape) == 2:
        batch, q_len = int(shape[0]), int(shape[1])
    elif embeds is not None:
        batch, q_len = embeds.shape[0], embeds.shape[1]
    else:
        return None
    if isinstance(cache_position, torch.Tensor) and cache_position.dim() == 1:
        return (batch, cache_position.long()) if cache_position.numel() == q_len else None
    past = param(inputs, "past_key_values_length", "past_length", "past_seen")
    if isinstance(past, int) and not isinstance(past, bool):
        return batch, torch.arange(past, past + q_len)
    return None


def visible_of(output, batch: int, n_keys: int, q_pos: torch.Tensor) -> torch.Tensor | None:
    # output [B, 1|H, Q, K] additive or bool, or None (plain causal) -> visible [B, 1|H, Q, K] bool
    if output is None:
        return visible_ref(q_pos[:, None], torch.arange(n_keys)[None, :], None).expand(batch, 1, -1, -1)
    if not isinstance(output, torch.Tensor) or output.dim() != 4:
        return None
    if output.dtype == torch.bool:
        return output
    if not output.is_floating_point():
        return None
    return output.double() > torch.finfo(output.dtype).min / 2


def check_mask_builder(name: str):
    def check(inputs: dict, output, ctx: dict) -> float | None:
        """Share of entries, over the rows of real (unpadded) queries, where the mask differs from
        causal ∧ window ∧ padding computed from the call's own positions."""
        known, window = expected_window(name, inputs, ctx)
        geometry = mask_geometry(inputs, output)
        pad = param(inputs, "attention_mask", "padding_mask")
        if not known or geometry is None or (pad is not None and not isinstance(pad, torch.Tensor)):
            return None
        if isinstance(pad, torch.Tensor) and pad.dim() != 2:
            return None  # a 4D mask handed in is passed through, not built here
        batch, q_pos = geometry
        n_keys = output.shape[-1] if isinstance(output, torch.Tensor) else int(q_pos.max()) + 1
        got = visible_of(output, batch, n_keys, q_pos)
        if got is None or got.shape[-2] != q_pos.numel() or n_keys <= int(q_pos.max()):
            return None
        real = torch.ones(batch, n_keys, dtype=torch.bool)  # [B, K]: keys past the padding mask are not padding
        if isinstance(pad, torch.Tensor):
            width = min(n_keys, pad.shape[1])
            real[:, :width] = pad[:, :width] != 0
        want = visible_ref(q_pos[:, None], torch.arange(n_keys)[None, :], window)[None] & real[:, None, :]  # [B, Q, K]
        rows = real[:, q_pos]  # [B, Q]: a padding query's row is never read
        if not rows.any():
            return None
        return float((got != want[:, None]).any(1)[rows].double().mean())

    return check


# ---------------------------------------------------------------- attention over the paged KV cache
#
# The layout serving engines share (vLLM's): key/value cache [num_blocks, block_size, KVH, D]; a
# sequence's block table maps its token position p to block table[p // block_size], offset
# p % block_size; seq_len counts the cached tokens including this step's, and a sequence's query rows
# are its last q_len tokens. Three call shapes: one sequence (a 1-D table and an int length), a batch
# of single-token decodes (a table row and a length per query row), and a packed batch (query start
# offsets). A split-KV partition returns (out, lse) over one range of key positions.


def gather_paged(cache: torch.Tensor, table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    # [NB, BS, KVH, D], [M], [N] -> [N, KVH, D]; IndexError when a position lies past the table
    bs = cache.shape[1]
    return cache[table[positions // bs], positions % bs]


def attention_ref(q, k, v, q_pos, kv_pos, scale: float, window, softcap):
    """fp64 softmax(q k^T * scale, soft-capped, causal/window-masked) v, grouped-query heads.
    q [L, H, D], k/v [N, KVH, D], q_pos [L], kv_pos [N] -> (out [L, H, D], lse [L, H], seen [L])."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = torch.einsum("lhd,nhd->hln", q.double(), k) * scale
    s = torch.tanh(s / softcap) * softcap if softcap else s
    seen = visible_ref(q_pos[:, None], kv_pos[None, :], window)  # [L, N]
    s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s, -1)  # [H, L]
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hln,nhd->lhd", p, v), lse.T, seen.any(-1)


def paged_sequences(q_rows: int, table, lens, starts) -> list[tuple[slice, torch.Tensor, int]] | None:
    """(query rows, block table, seq_len) per sequence, from the call's shape; None if it fits none."""
    if isinstance(table, torch.Tensor) and table.dim() == 1 and isinstance(lens, (int, torch.Tensor)):
        return (
            [(slice(0, q_rows), table, int(lens))] if not isinstance(lens, torch.Tensor) or lens.numel() == 1 else None
        )
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or not isinstance(lens, torch.Tensor):
        return None
    if isinstance(starts, torch.Tensor) and starts.numel() == lens.numel() + 1:
        bounds = starts.tolist()
        return [(slice(bounds[s], bounds[s + 1]), table[s], int(lens[s])) for s in range(lens.numel())]
    if lens.numel() == q_rows == table.shape[0]:
        return [(slice(s, s + 1), table[s], int(lens[s])) for s in range(q_rows)]
    return None


def kv_range(inputs: dict) -> tuple[int, int] | None:
    """The key positions [start, end) a split-KV partition covers, from its integer parameters."""
    ints = {k.lower(): v for k, v in inputs.items() if isinstance(v, int) and not isinstance(v, bool)}
    start = next((v for k, v in ints.items() if k in ("p0", "start", "begin", "kv_start", "partition_start")), None)
    size = next((v for k, v in ints.items() if k in ("part", "partition", "partition_size", "size")), None)
    end = next((v for k, v in ints.items() if k in ("end", "stop", "kv_end", "partition_end")), None)
    if start is None:
        return None
    if end is not None:
        return start, end
    return (start, start + size) if size is not None else None


def check_paged_attention(inputs: dict, output, _ctx: dict) -> float | None:
    """The robust error ratio (tools.probe.compare) of the output against fp64 attention recomputed
    from the recorded query, cache and block table: ~1 for a correct kernel, THRESHOLD is the bar."""
    q = next((v for k, v in inputs.items() if k.lower() in ("q", "query", "queries")), None)
    k_cache, v_cache = param(inputs, "key_cache", "k_cache"), param(inputs, "value_cache", "v_cache")
    if not (isinstance(q, torch.Tensor) and isinstance(k_cache, torch.Tensor) and isinstance(v_cache, torch.Tensor)):
        return None
    if k_cache.dim() != 4:
        return None
    partial = isinstance(output, (tuple, list))
    span = kv_range(inputs)
    out, lse = (output[0], output[1]) if partial and len(output) == 2 else (output, None)
    if not isinstance(out, torch.Tensor) or out.numel() != q.numel() or (partial and span is None):
        return None
    d = k_cache.shape[-1]
    q, got = q.reshape(q.shape[0], -1, d), out.reshape(q.shape[0], -1, d)  # [R, H, D]
    seqs = paged_sequences(
        q.shape[0],
        param(inputs, "block_table"),
        param(inputs, "seq_len", "context_len"),
        param(inputs, "query_start", "cu_seqlens_q", "cu_seq_lens_q"),
    )
    if seqs is None or q.shape[1] % k_cache.shape[2]:
        return None
    scale = param(inputs, "scale")
    scale = float(scale) if isinstance(scale, (int, float)) else d**-0.5
    window, softcap = param(inputs, "window"), param(inputs, "softcap", "soft_cap", "logit_cap")
    window = window if isinstance(window, int) and not isinstance(window, bool) else None
    softcap = float(softcap) if isinstance(softcap, (int, float)) else None
    want, want_lse, seen = (
        torch.zeros(q.shape, dtype=torch.float64),
        torch.zeros(q.shape[:2], dtype=torch.float64),
        torch.zeros(q.shape[0], dtype=torch.bool),
    )
    for rows, table, n in seqs:
        lo, hi = span if span is not None else (0, n)
        kv_pos = torch.arange(lo, max(lo, min(hi, n)))  # empty: a partition past a short sequence
        q_pos = torch.arange(n - (rows.stop - rows.start), n)
        k, v = gather_paged(k_cache, table, kv_pos), gather_paged(v_cache, table, kv_pos)
        want[rows], want_lse[rows], seen[rows] = attention_ref(q[rows], k, v, q_pos, kv_pos, scale, window, softcap)
    return attention_ratio(got, want, seen, lse, want_lse)


def attention_ratio(got, want, seen, lse, want_lse) -> float | None:
    # [R, H, D] x2, [R] rows with a visible key, [R, H] x2 (lse optional) -> worst row's ratio
    if not seen.any():
        return None
    t, y = got[seen].flatten(1).double(), want[seen].flatten(1)
    floor = NOISE_FLOOR.get(str(got.dtype).removeprefix("torch."), NOISE_FLOOR["float32"])
    ratio = float(robust_ratio(t, y.to(got.dtype).double(), y, floor)[0].max())
    if isinstance(lse, torch.Tensor) and lse.numel() == want_lse.numel():
        lse_floor = NOISE_FLOOR.get(str(lse.dtype).removeprefix("torch."), NOISE_FLOOR["float32"])
        lse_err = (lse.reshape(want_lse.shape)[seen].double() - want_lse[seen]).abs().max()
        ratio = max(ratio, float(lse_err) / lse_floor)
    return ratio


def is_paged_attention(_name: str, params: tuple[str, ...]) -> bool:
    query = any(p.lower() in ("q", "query", "queries") for p in params)
    return (
        query
        and has(params, "key_cache", "k_cache")
        and has(params, "value_cache", "v_cache")
        and has(params, "block_table")
    )


# ---------------------------------------------------------------- writing the paged KV cache
#
# A cache writer scatters this step's keys and values [T, KVH, D] (or [T, KVH*D]) into the key/value
# cache at the slots its slot mapping names (slot = block * block_size + offset; a negative slot is
# padding and is skipped). Its result is what it wrote: the cache arguments after the call
# (tools/engines/functaps.py copies a tensor argument written in place at the return). Read back at
# those slots, in a layout the cache's own shape allows, the cache must hold exactly the rows passed in,
# head by head, and every other entry must be as it was. The layouts: [slots, KVH, D], token-major
# blocks [NB, block_size, KVH, D] (vLLM's) and head-major blocks [NB, KVH, block_size, D]; where the
# shape allows both (block_size == KVH) a write that reads back right in either keeps the contract.

KEY_NAMES, VALUE_NAMES = ("key", "k", "keys"), ("value", "v", "values")
KEY_CACHE_WORDS, VALUE_CACHE_WORDS = ("key_cache", "k_cache"), ("value_cache", "v_cache")
SLOT_WORDS = ("slot",)


def named(inputs: dict, names: tuple[str, ...]):
    """The input whose parameter name is exactly one of `names` (None if none is)."""
    return next((v for k, v in inputs.items() if k.lower() in names), None)


def cache_layouts(cache: torch.Tensor, kvh: int) -> list[str]:
    # cache [S, KVH, D] | [NB, BS, KVH, D] | [NB, KVH, BS, D] -> the layouts its shape allows
    if cache.dim() == 3:
        return ["slots"] if cache.shape[1] == kvh else []
    if cache.dim() != 4:
        return []
    return [name for name, axis in (("token-major", 2), ("head-major", 1)) if cache.shape[axis] == kvh]


def slot_index(cache: torch.Tensor, layout: str, slots: torch.Tensor) -> tuple:
    # [N] slots -> an index that reads [N, KVH, D] rows of `cache` in `layout`
    if layout == "slots":
        return (slots,)
    bs = cache.shape[1] if layout == "token-major" else cache.shape[2]
    blocks, offsets = slots // bs, slots % bs
    if layout == "token-major":
        return (blocks, offsets)
    heads = torch.arange(cache.shape[1])
    return (blocks[:, None], heads[None, :], offsets[:, None])  # -> [N, KVH, D]


def write_error(before: torch.Tensor, after: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, layout: str):
    """max(relative error of the rows read back at `slots`, size of any change elsewhere relative to the
    rows). before/after [cache], rows [N, KVH, D], slots [N] -> float"""
    where = slot_index(after, layout, slots)
    want = rows.to(after.dtype).double()
    err = rel_err(after[where], want)
    elsewhere = torch.ones_like(after, dtype=torch.bool)
    elsewhere[where] = False
    same = (after == before) | (after.isnan() & before.isnan())
    stray = elsewhere & ~same
    if stray.any():
        diff = (after.double() - before.double()).nan_to_num(1e30, 1e30, -1e30)[stray]
        err = max(err, float(diff.norm() / want.norm().clamp_min(1e-30)))
    return err


def check_kv_write(inputs: dict, writes, _ctx: dict) -> float | None:
    """The larger of the key and the value cache's write errors, in the best layout the shape allows."""
    slots = param(inputs, *SLOT_WORDS)
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or not isinstance(writes, dict):
        return None
    errs = []
    for names, words in ((KEY_NAMES, KEY_CACHE_WORDS), (VALUE_NAMES, VALUE_CACHE_WORDS)):
        rows, cache_name = named(inputs, names), next((k for k in inputs if any(w in k.lower() for w in words)), None)
        before = inputs.get(cache_name) if cache_name else None
        if not isinstance(rows, torch.Tensor) or not isinstance(before, torch.Tensor):
            return None
        if not before.is_floating_point() or before.element_size() < 2 or rows.shape[0] != slots.numel():
            return None  # a quantized cache stores scaled codes, not the rows
        after, d = writes.get(cache_name, before), before.shape[-1]
        if after.shape != before.shape or rows.numel() % (rows.shape[0] * d):
            return None
        real = slots >= 0
        rows, used = rows.reshape(rows.shape[0], -1, d)[real], slots[real].long()
        if used.unique().numel() != used.numel():
            return None  # two rows for one slot: which one wins is not the writer's to promise
        errs.append(
            min(
                (write_error(before, after, rows, used, lay) for lay in cache_layouts(before, rows.shape[1])),
                default=None,
            )
        )
    return None if None in errs else max(e for e in errs if e is not None)


def is_kv_write(_name: str, params: tuple[str, ...]) -> bool:
    lowered = {p.lower() for p in params}
    return (
        bool(lowered & set(KEY_NAMES))
        and bool(lowered & set(VALUE_NAMES))
        and has(params, *KEY_CACHE_WORDS)
        and has(params, *VALUE_CACHE_WORDS)
        and has(params, *SLOT_WORDS)
    )


def written_tolerance(writes) -> float:
    """A copy into the cache rounds to the cache's dtype at most once."""
    t = next((w for w in writes.values() if isinstance(w, torch.Tensor)), None) if isinstance(writes, dict) else None
    return TOLERANCE.get(t.dtype, 1e-5) if t is not None else 1e-5


# ---------------------------------------------------------------- rotary embedding


def check_cos_sin(inputs: dict, output, _ctx: dict) -> float | None:
    """A cos/sin table from frequencies and positions: angle = position * inv_freq, times the rope
    type's attention scaling; laid out as [cos | sin], [cos cos | sin sin], or a (cos, sin) pair."""
    freqs, positions = param(inputs, "inv_freq", "freq"), param(inputs, "position")
    scale = param(inputs, "scaling", "mscale", "attention_factor")
    if not isinstance(freqs, torch.Tensor) or not isinstance(positions, torch.Tensor):
        return None
    scale = float(scale) if isinstance(scale, (int, float)) else 1.0
    angles = positions.double()[:, None] * freqs.double()[None, :]  # [P, F]
    cos, sin = angles.cos() * scale, angles.sin() * scale
    layouts = [torch.cat((cos, sin), -1), torch.cat((cos, cos, sin, sin), -1)]
    if isinstance(output, (tuple, list)) and len(output) == 2:
        got = (
            torch.cat([o.reshape(cos.shape[0], -1) for o in output], -1)
            if all(isinstance(o, torch.Tensor) for o in output)
            else None
        )
    else:
        got = output if isinstance(output, torch.Tensor) else None
    errs = [rel_err(got, w) for w in layouts if got is not None and got.shape == w.shape]
    return min(errs) if errs else None


def is_cos_sin(_name: str, params: tuple[str, ...]) -> bool:
    return has(params, "inv_freq") and has(params, "position")


def check_inv_freq(inputs: dict, output, _ctx: dict) -> float | None:
    """Frequencies (and the cos/sin scale) from a rope config, against tools/refmodels/rope.py."""
    rope = next((v for v in inputs.values() if isinstance(v, dict) and ("rope_theta" in v or "base" in v)), None)
    dim = param(inputs, "dim")
    max_pos = param(inputs, "max_pos", "max_position")
    if rope is None or not isinstance(dim, int) or not isinstance(max_pos, int):
        return None
    rope = {**rope, "rope_type": rope.get("rope_type", rope.get("type", "default"))}
    rope.setdefault("rope_theta", rope.get("base"))
    seq_len = param(inputs, "seq_len", "length")
    length = int(seq_len) if isinstance(seq_len, (int, float, torch.Tensor)) else max_pos
    try:
        want, scale = rope_ref.frequencies(rope, dim, length, max_pos, torch.float64)
    except (KeyError, ValueError, TypeError):
        return None
    return frequency_error(output, want, scale)


def frequency_error(output, want: torch.Tensor, scale: float) -> float | None:
    # output: [dim/2] frequencies, or (frequencies, cos/sin scale) -> the larger relative error
    got, got_scale = (output[0], output[1]) if isinstance(output, (tuple, list)) else (output, None)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return None
    err = rel_err(got, want)
    if isinstance(got_scale, (int, float)):
        err = max(err, abs(float(got_scale) - scale) / abs(scale))
    return err


def rope_of_config(config: dict) -> tuple[dict, int, int] | None:
    """(rope settings, rotary dim, max positions) from a checkpoint-format config (DESIGN §1: the
    HF config.json keys, old `rope_scaling` + `rope_theta` or new `rope_parameters`)."""
    scaling = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = config.get("rope_theta") or (scaling.get("rope_theta") if isinstance(scaling, dict) else None)
    heads, hidden, max_pos = (config.get(k) for k in ("num_attention_heads", "hidden_size", "max_position_embeddings"))
    if not (isinstance(heads, int) and isinstance(hidden, int) and isinstance(max_pos, int)):
        return None
    if not isinstance(scaling, dict) or not theta:
        return None
    head_dim = config.get("head_dim") or hidden // heads
    dim = int(head_dim * (config.get("partial_rotary_factor") or 1.0))
    rope = {**scaling, "rope_theta": theta, "rope_type": scaling.get("rope_type", scaling.get("type", "default"))}
    return rope, dim, max_pos


def check_config_freq(inputs: dict, output, _ctx: dict) -> float | None:
    """Frequencies (and cos/sin scale) computed from the model's config, against refmodels.rope."""
    config = param(inputs, "config")
    found = rope_of_config(config) if isinstance(config, dict) else None
    if found is None:
        return None
    rope, dim, max_pos = found
    seq_len = param(inputs, "seq_len")
    length = int(seq_len) if isinstance(seq_len, (int, float, torch.Tensor)) else max_pos
    try:
        want, scale = rope_ref.frequencies(rope, dim, length, max_pos, torch.float64)
    except (KeyError, ValueError, TypeError):
        return None
    return frequency_error(output, want, scale)


def is_config_freq(name: str, params: tuple[str, ...]) -> bool:
    n = name.lower()
    return ("param" in n or "freq" in n) and "config" in params and has(params, "seq_len")


def is_inv_freq(name: str, params: tuple[str, ...]) -> bool:
    return "inv_freq" in name.lower() and has(params, "rope", "config") and has(params, "dim")


def check_base_inv_freq(inputs: dict, output, _ctx: dict) -> float | None:
    base, dim = param(inputs, "base", "theta"), param(inputs, "dim")
    if not isinstance(base, (int, float)) or not isinstance(dim, int) or not isinstance(output, torch.Tensor):
        return None
    want = rope_ref.default_freqs(float(base), dim, torch.float64)
    return rel_err(output, want) if output.shape == want.shape else None


def is_base_inv_freq(name: str, params: tuple[str, ...]) -> bool:
    return "inv_freq" in name.lower() and has(params, "base", "theta") and has(params, "dim") and len(params) == 2


def check_rotary(inputs: dict, output, _ctx: dict) -> float | None:
    """Rotate-half RoPE of q and k at `positions`, from a [max_pos, rot_dim] table of cos | sin."""
    positions, cache = param(inputs, "position"), param(inputs, "cos_sin", "cache")
    q, k, head_dim = param(inputs, "query"), param(inputs, "key"), param(inputs, "head_dim", "head_size")
    if not all(isinstance(t, torch.Tensor) for t in (positions, cache, q, k)) or not isinstance(head_dim, int):
        return None
    if not isinstance(output, (tuple, list)) or len(output) != 2 or cache.shape[-1] != head_dim:
        return None
    cos, sin = cache.double()[positions].chunk(2, dim=-1)  # [T, D/2] each
    cos, sin = torch.cat((cos, cos), -1)[:, None], torch.cat((sin, sin), -1)[:, None]
    errs = []
    for x, got in zip((q, k), output):
        xs = x.double().reshape(x.shape[0], -1, head_dim)  # [T, N, D]
        half = head_dim // 2
        turned = torch.cat((-xs[..., half:], xs[..., :half]), -1)
        errs.append(rel_err(got.reshape(xs.shape), xs * cos + turned * sin))
    return max(errs)


def is_rotary(_name: str, params: tuple[str, ...]) -> bool:
    return has(params, "position") and has(params, "query") and has(params, "key") and has(params, "cos_sin")


# ---------------------------------------------------------------- sampler


def kept_mismatch(inputs: dict, output, setting: dict) -> float | None:
    """Share of entries where the function's kept set ([S, V], finite = kept) leaves the rule's:
    every surely kept token must be kept, no surely dropped one may be (tools/probe/sampling_ref)."""
    x = first_tensor(inputs)
    given = given_distribution(inputs)
    if given is not None:  # judged on the distribution it was handed (inconsistent_inputs says if that is wrong)
        x = given[1].double().clamp_min(1e-300).log().masked_fill(given[1] <= 0, float("-inf"))
    if x is None or not isinstance(output, torch.Tensor) or output.shape != x.shape or x.dim() != 2:
        return None
    kept, bad = torch.isfinite(output), 0
    for row in range(x.shape[0]):
        s = {key: (float(v[row]) if isinstance(v, torch.Tensor) else v) for key, v in setting.items()}
        if "top_k" in s:
            s["top_k"] = int(s["top_k"])
        finite = x[row][torch.isfinite(x[row])]
        eps = 1e-6 * float(finite.abs().max()) if finite.numel() else 0.0
        sure, maybe = sampling_ref.kept_bounds(x[row], s, eps, mass_tol=1e-6)
        bad += int((sure & ~kept[row]).sum() + (kept[row] & ~maybe).sum())
    return bad / x.numel()


def check_cut(key: str, *words: str):
    def check(inputs: dict, output, _ctx: dict) -> float | None:
        value = param(inputs, *words)
        if not isinstance(value, (torch.Tensor, int, float)):
            return None
        return kept_mismatch(inputs, output, {key: value})

    return check


def is_cut(word: str, *param_words: str):
    def applies(name: str, params: tuple[str, ...]) -> bool:
        return word in name.lower().replace("topk", "top_k").replace("minp", "min_p") and has(params, *param_words)

    return applies


def check_penalty(inputs: dict, output, ctx: dict) -> float | None:
    """With the penalty state the function was given readable (per-row penalties and the tokens seen,
    `penalty_state`): the largest per-row relative error against the reference penalties computed
    from that state (repetition over prompt + output, presence / frequency over output counts,
    tools/probe/sampling_ref.penalize). Otherwise only what any definition implies: penalties that
    are all non-negative never raise a logit (the largest rise, relative to the largest logit)."""
    x, got = first_tensor(inputs), out_tensor(output)
    if x is None or got is None or got.shape != x.shape:
        return None
    state = penalty_state(inputs, *x.shape) if x.dim() == 2 else None
    if state is not None:
        return row_error(got, sampling_ref.penalize(x, *state))
    for s in ctx.get("sampling", []):
        if (
            s.get("repetition_penalty", 1.0) < 1.0
            or min(s.get("presence_penalty", 0.0), s.get("frequency_penalty", 0.0)) < 0
        ):
            return None  # a negative penalty may raise a logit on purpose
    finite = torch.isfinite(x) & torch.isfinite(got)
    rise = (got.double() - x.double()).where(finite, torch.zeros((), dtype=torch.float64)).clamp_min(0)
    return float(rise.max() / x.double()[finite].abs().max().clamp_min(1e-30))


def row_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """[S, V] x2 -> the largest per-row relative error over the entries finite in both; a row whose
    -inf entries differ is off by 1 (a masked token unmasked, or the reverse)."""
    worst = 0.0
    for g, w in zip(got.double(), want.double()):
        both = torch.isfinite(g) & torch.isfinite(w)
        if not bool((torch.isfinite(g) == torch.isfinite(w)).all()):
            return 1.0
        worst = max(worst, rel_err(g[both], w[both]) if bool(both.any()) else 0.0)
    return worst


def is_penalty(name: str, params: tuple[str, ...]) -> bool:
    return "penalt" in name.lower() and has(params, "logit")


# The per-row settings of a penalty step, under the names serving engines give them, and their
# neutral values (a row that sets none is left as it is).
PENALTY_SETTINGS = (("repetition", 1.0), ("presence", 0.0), ("frequency", 0.0))


def state_items(inputs: dict) -> dict:
    """A call's inputs with a state object's fields (a dict, functaps.snapshot_param) lifted beside them."""
    flat = {k: v for k, v in inputs.items() if not isinstance(v, dict)}
    for v in inputs.values():
        if isinstance(v, dict):
            flat.update({k: w for k, w in v.items() if k not in flat})
    return flat


def per_row(value, rows: int, neutral: float) -> torch.Tensor | None:  # a setting -> [S] fp64
    if value is None:
        return torch.full((rows,), neutral, dtype=torch.float64)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.full((rows,), float(value), dtype=torch.float64)
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() in (1, rows):
        return value.double().reshape(-1).expand(rows).clone()
    return None


def vocab_table(value, rows: int, vocab: int) -> torch.Tensor | None:
    """What a history entry says per vocabulary entry: [S, V] occurrences, from a [S, V] mask or count
    table, or from each row's token ids (a list per row, or a padded [S, L] id tensor)."""
    if isinstance(value, torch.Tensor) and value.shape == (rows, vocab) and not value.is_floating_point():
        return value.long()
    if (
        isinstance(value, torch.Tensor)
        and value.dim() == 2
        and value.shape[0] == rows
        and not value.is_floating_point()
    ):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and len(value) == rows and all(isinstance(r, (list, tuple)) for r in value):
        if all(isinstance(i, int) for r in value for i in r):
            return torch.stack([sampling_ref.token_counts(list(r), vocab) for r in value])
    return None


def token_history(items: dict, rows: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """([S, V] seen in prompt or output, [S, V] output counts) from the history entries a state names
    (`prompt_mask`, `output_counts`, `token_counts`, `prompt_token_ids`, …): seen is any occurrence in
    any of them; the counts are those of the entries named for the output, or of all when none is."""
    tables = {
        k: t
        for k, v in items.items()
        if any(w in k.lower() for w in ("prompt", "output", "token", "count", "seen"))
        and (t := vocab_table(v, rows, vocab)) is not None
    }
    if not tables:
        return None
    seen = torch.stack([t > 0 for t in tables.values()]).any(0)
    named_output = [t for k, t in tables.items() if "output" in k.lower()]
    counts = sum(named_output or list(tables.values()), torch.zeros(rows, vocab, dtype=torch.long))
    return seen, counts


def penalty_state(inputs: dict, rows: int, vocab: int) -> tuple | None:
    """(seen [S, V], counts [S, V], repetition [S], presence [S], frequency [S]) a penalty step was given,
    or None when it names no per-row setting or no token history."""
    items = state_items(inputs)
    settings = []
    for word, neutral in PENALTY_SETTINGS:
        value = next((v for k, v in items.items() if word in k.lower()), None)
        settings.append(per_row(value, rows, neutral))
    named = any(word in k.lower() for k in items for word, _ in PENALTY_SETTINGS)
    history = token_history(items, rows, vocab)
    if not named or history is None or any(s is None for s in settings):
        return None
    return (*history, *settings)


def check_penalty_state(inputs: dict, attrs, _ctx: dict) -> float | None:
    """A penalty state built from each row's prompt and output tokens (its own inputs) must say what the
    reference reads: seen = any occurrence in prompt or output, counts = occurrences in the output
    only. The size is the share of [S, V] entries where the state the object carries says otherwise."""
    prompts, outputs = param(inputs, "prompt"), param(inputs, "output")
    if not isinstance(attrs, dict) or not isinstance(prompts, (list, tuple)) or not isinstance(outputs, (list, tuple)):
        return None
    rows = len(prompts)
    vocab = next((v.shape[1] for v in attrs.values() if isinstance(v, torch.Tensor) and v.dim() == 2), None)
    if vocab is None or len(outputs) != rows or rows == 0:
        return None
    history = token_history(attrs, rows, vocab)
    want_p, want_o = vocab_table(list(prompts), rows, vocab), vocab_table(list(outputs), rows, vocab)
    if history is None or want_p is None or want_o is None:
        return None
    seen, counts = history
    wrong = (seen != ((want_p + want_o) > 0)) | (counts != want_o)
    return float(wrong.double().mean())


def is_penalty_state(_name: str, params: tuple[str, ...]) -> bool:
    return has(params, "prompt") and has(params, "output") and not has(params, "logit", "text", "str")


def check_temperature(inputs: dict, output, _ctx: dict) -> float | None:
    """logits / T per row, T from the call's own inputs or state (rows with T <= 0 are greedy: an engine
    may leave them as they are or scale them, so they are not judged)."""
    x, got = first_tensor(inputs), out_tensor(output)
    if x is None or got is None or got.shape != x.shape or x.dim() != 2:
        return None
    value = next((v for k, v in state_items(inputs).items() if "temperature" in k.lower()), None)
    t = per_row(value, x.shape[0], 1.0) if value is not None else None
    if t is None:
        return None
    rows = t > 0
    if not bool(rows.any()):
        return None
    return row_error(got[rows], x.double()[rows] / t[rows].view(-1, 1))


def is_temperature(name: str, params: tuple[str, ...]) -> bool:
    return "temperature" in name.lower() and has(params, "logit")


def given_distribution(inputs: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """([S, V] logits, [S, V] probabilities) when a call is handed both (a cut that reuses a softmax
    computed elsewhere); None otherwise."""
    x, probs = first_tensor(inputs), param(inputs, "prob")
    if x is None or not isinstance(probs, torch.Tensor) or probs is x or probs.shape != x.shape or x.dim() != 2:
        return None
    return x, probs


def inconsistent_inputs(inputs: dict) -> float:
    """How far the probabilities a call is handed are from the softmax of the logits it is handed
    (largest |difference|; 0 when it is not handed both): a cut judged on the probabilities it was
    given can be right while what it was given is wrong, and then whoever computed them is."""
    given = given_distribution(inputs)
    if given is None:
        return 0.0
    x, probs = given
    return float((torch.softmax(x.double(), -1) - probs.double()).abs().max())


# ---------------------------------------------------------------- quantization


def check_int8_quantizer(inputs: dict, output, _ctx: dict) -> float | None:
    """Symmetric per-row int8: w ~ q * s with q = round(w / s), so no weight is off by more than half
    a step. The size is the largest error in steps."""
    w = first_tensor(inputs)
    if w is None or w.dim() != 2 or not isinstance(output, (tuple, list)) or len(output) != 2:
        return None
    q, scale = output
    if not isinstance(q, torch.Tensor) or q.dtype != torch.int8 or q.shape != w.shape:
        return None
    if not isinstance(scale, torch.Tensor) or scale.numel() != w.shape[0]:
        return None
    s = scale.double().reshape(-1, 1)
    clipped = w.double().clamp(-127 * s, 127 * s)
    return float(((q.double() * s - clipped).abs() / s).max())


def is_int8_quantizer(name: str, params: tuple[str, ...]) -> bool:
    n = name.lower()
    return "quant" in n and "int8" in n and "dequant" not in n and len(params) <= 2


# Bits a quantizer's name declares ("int4", "4bit", "w8"): the range its codes must stay in.
BIT_WORDS = {4: ("int4", "4bit", "w4", "q4"), 8: ("int8", "8bit", "w8", "q8"), 2: ("int2", "2bit"), 3: ("int3", "3bit")}


def declared_bits(name: str) -> int | None:
    n = name.lower()
    return next((b for b, words in BIT_WORDS.items() if any(w in n for w in words)), None)


def unpacked_codes(codes: torch.Tensor, shape: torch.Size, signed: bool) -> list[torch.Tensor]:
    """[O, I] codes, or [O, I/2] bytes of two 4-bit codes each -> [O, I] codes in either nibble order
    (the convention is the engine's; a contract judges the values, not the packing)."""
    if codes.shape == shape:
        return [codes.long()]
    if codes.dim() != 2 or codes.shape[0] != shape[0] or codes.shape[1] * 2 != shape[1]:
        return []
    b = codes.long() & 0xFF
    lo, hi = b & 0xF, (b >> 4) & 0xF
    if signed:  # two's complement nibbles
        lo, hi = lo - 16 * (lo >= 8), hi - 16 * (hi >= 8)
    return [torch.stack(pair, dim=-1).reshape(shape) for pair in ((lo, hi), (hi, lo))]


def per_weight(t: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
    """A per-row [O] or per-group [O, G] scale (or zero) -> [O, I], each weight its group's value."""
    rows, cols = shape
    t = t.double().reshape(rows, -1) if t.numel() % rows == 0 else None
    if t is None or cols % t.shape[1]:
        return None
    return t.repeat_interleave(cols // t.shape[1], dim=1)


def check_quant_roundtrip(name: str):
    """(w [O, I]) -> (codes, scale [O] | [O, G] (, zero)): codes lie in the declared bit range and
    (codes - zero) * scale is within half a step of w. The size is the largest error in steps."""

    def check(inputs: dict, output, _ctx: dict) -> float | None:
        w = first_tensor(inputs)
        if w is None or w.dim() != 2 or not isinstance(output, (tuple, list)) or len(output) not in (2, 3):
            return None
        codes, scale, zero = (*output, None)[:3]
        tensors = [t for t in (codes, scale, zero) if t is not None]
        if not all(isinstance(t, torch.Tensor) for t in tensors) or codes.is_floating_point():
            return None
        s, z = per_weight(scale, w.shape), per_weight(zero, w.shape) if zero is not None else 0.0
        bits = declared_bits(name) or (4 if codes.numel() * 2 == w.numel() else None)
        if s is None or z is None or bits is None or not scale.is_floating_point():
            return None
        low, high = (0, 2**bits - 1) if zero is not None else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        errors = []
        for q in unpacked_codes(codes, w.shape, signed=zero is None):
            outside = float(((q < low) | (q > high)).any())
            errors.append(max(outside, float(((q.double() - z) * s - w.double()).abs().div(s).max())))
        return min(errors) if errors else None

    return check


def is_quantizer(name: str, params: tuple[str, ...]) -> bool:
    n = name.lower()
    return "quant" in n and "dequant" not in n and 1 <= len(params) <= 3


def check_model_quantizer(inputs: dict, writes, _ctx: dict) -> float | None:
    """A function that converts a model's layers (its module argument as ModuleWeights at the call,
    and in `writes` as the call left it) converts alike the siblings it chooses among: under one
    parent module, where it converted (took the float weight matrix of) some children, every child
    that held one must be converted too. The size is the largest share of such a parent's float
    children it left as they were (0 where it converted all of them or none)."""
    sizes = []
    for name, before in inputs.items():
        after = writes.get(name) if isinstance(writes, dict) else None
        if not isinstance(before, ModuleWeights) or not isinstance(after, ModuleWeights):
            continue
        groups: dict[str, list[bool]] = {}
        for child in before.float_matrices:
            groups.setdefault(child.rpartition(".")[0], []).append(child not in after.float_matrices)
        for converted in groups.values():
            if any(converted):
                sizes.append(converted.count(False) / len(converted))
    return max(sizes) if sizes else None


def is_model_quantizer(name: str, params: tuple[str, ...]) -> bool:
    """Named for quantizing, handed a whole model or module (not one weight)."""
    n = name.lower()
    return "quant" in n and "dequant" not in n and any(p.lower() in ("model", "module", "net") for p in params)


# ---------------------------------------------------------------- config readers

# Checkpoint config keys whose meaning is unambiguous, each with the names a reader may keep it
# under; a reader's object that has one of these attributes must hold the value the file states.
# Not `sliding_window`: a file may state one that another key switches off (qwen2's use_sliding_window).
CONFIG_KEYS = (
    ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"),
    ("rope_theta",),
    ("head_dim",),
    ("hidden_size",),
    ("intermediate_size",),
    ("num_hidden_layers",),
    ("num_attention_heads",),
    ("num_key_value_heads",),
    ("vocab_size",),
    ("max_position_embeddings",),
    ("attn_logit_softcapping",),
    ("final_logit_softcapping",),
    ("query_pre_attn_scalar",),
    ("tie_word_embeddings",),
    ("partial_rotary_factor",),
)
HF_MARKERS = ("model_type", "hidden_size", "num_attention_heads", "vocab_size", "num_hidden_layers")


def kept_value(attrs: dict, names: tuple[str, ...]) -> list:
    """The values the reader's object keeps under `names`: its attributes, or keys of a dict
    attribute one level down (a rope dict that holds rope_theta)."""
    found = [attrs[n] for n in names if n in attrs]
    nested = [v[n] for v in attrs.values() if isinstance(v, dict) for n in names if n in v]
    return found or nested


def stated(config: dict, names: tuple[str, ...]):
    """The one number or bool the file states under `names`; None when absent or ambiguous."""
    values = {config[n] for n in names if isinstance(config.get(n), (int, float)) and not isinstance(config[n], bool)}
    values |= {config[n] for n in names if isinstance(config.get(n), bool)}
    return next(iter(values)) if len(values) == 1 else None


def check_config_reader(inputs: dict, attrs, _ctx: dict) -> float | None:
    """A reader given the parsed config.json returns an object holding each value the file states
    (a default used instead, or another key read, breaks it). The size is the largest relative
    difference (1 for a bool that flipped)."""
    config = first_dict(inputs)
    if config is None or not isinstance(attrs, dict) or sum(k in config for k in HF_MARKERS) < 3:
        return None
    sizes = []
    for names in CONFIG_KEYS:
        want = stated(config, names)
        for got in kept_value(attrs, names) if want is not None else []:
            if isinstance(got, bool) or isinstance(want, bool):
                sizes.append(float(got is not want and got != want))
            elif isinstance(got, (int, float)):
                sizes.append(abs(float(got) - float(want)) / max(abs(float(want)), 1e-30))
            else:
                sizes.append(1.0)  # the file states a number, the reader keeps None or something else
    return max(sizes) if sizes else None


def first_dict(inputs: dict) -> dict | None:
    return next((v for v in inputs.values() if isinstance(v, dict)), None)


def is_config_reader(name: str, params: tuple[str, ...]) -> bool:
    """One argument, named as a constructor from data (`from_dict`, `from_hf`, `parse_config`)."""
    n = name.lower()
    return len(params) == 1 and (n.startswith("from_") or ("config" in n and has((n,), "parse", "read", "load")))


# ---------------------------------------------------------------- the table


def fixed(value: float) -> Callable[[object], float]:
    return lambda _output: value


CONTRACTS: list[Contract] = [
    Contract(
        "rms-norm",
        "norm",
        "x / sqrt(mean(x^2) + eps) * (offset + w), residual added first",
        lambda n, p: "rms" in n.lower() and "norm" in n.lower() and has(p, "weight") and has(p, "eps"),
        check_rms_norm,
        dtype_tolerance,
    ),
    Contract(
        "gated-activation",
        "activation",
        "act(gate) * up over the fused [gate | up] input",
        is_gated_activation,
        None,
        dtype_tolerance,
    ),  # check bound per name in contract_check
    Contract("softcap", "attention", "tanh(x / cap) * cap", is_softcap, check_softcap, dtype_tolerance),
    Contract(
        "attention-mask", "attention", "key visible iff kv <= q and kv > q - window", is_mask, check_mask, fixed(0.0)
    ),
    Contract(
        "attention-mask-4d",
        "attention",
        "[B, 1|H, Q, K] mask: key visible iff kv <= q, kv > q - window, and not padding",
        is_mask_builder,
        None,
        fixed(0.0),
    ),  # check bound per name in contract_check
    Contract(
        "paged-attention",
        "attention",
        "softmax(q k^T * scale, capped, causal/window mask) v over the block table's keys",
        is_paged_attention,
        check_paged_attention,
        fixed(THRESHOLD),
    ),
    Contract(
        "kv-cache-write",
        "attention",
        "the cache read back at the call's slots holds exactly its key/value rows, per head; nothing else changes",
        is_kv_write,
        check_kv_write,
        written_tolerance,
        judges_writes=True,
    ),
    Contract(
        "rope-base-frequencies", "rotary", "theta ** (-2i / dim)", is_base_inv_freq, check_base_inv_freq, fixed(2e-5)
    ),
    Contract(
        "rope-frequencies",
        "rotary",
        "inv_freq and cos/sin scale of the rope type (refmodels.rope)",
        is_inv_freq,
        check_inv_freq,
        fixed(2e-5),
    ),
    Contract(
        "rope-config-frequencies",
        "rotary",
        "inv_freq and cos/sin scale of the config's rope type (refmodels.rope)",
        is_config_freq,
        check_config_freq,
        fixed(2e-5),
    ),
    Contract(
        "rope-cos-sin",
        "rotary",
        "cos/sin of position * inv_freq, times the attention scaling",
        is_cos_sin,
        check_cos_sin,
        dtype_tolerance,
    ),
    Contract(
        "rope-rotation", "rotary", "rotate-half RoPE from the cos | sin table", is_rotary, check_rotary, dtype_tolerance
    ),
    Contract(
        "top-k",
        "sampler",
        "keep the logits >= the k-th largest",
        is_cut("top_k", "top_k", "k"),
        check_cut("top_k", "top_k", "k"),
        fixed(0.0),
    ),
    Contract(
        "top-p",
        "sampler",
        "keep the smallest set whose mass reaches p",
        is_cut("top_p", "top_p", "p"),
        check_cut("top_p", "top_p", "p"),
        fixed(0.0),
    ),
    Contract(
        "min-p",
        "sampler",
        "drop tokens with probability < min_p * max probability",
        is_cut("min_p", "min_p"),
        check_cut("min_p", "min_p"),
        fixed(0.0),
    ),
    Contract(
        "penalty",
        "sampler",
        "repetition over prompt + output, presence / frequency over output counts, from the state it is given",
        is_penalty,
        check_penalty,
        dtype_tolerance,
    ),
    Contract(
        "temperature", "sampler", "logits / T per row (T > 0)", is_temperature, check_temperature, dtype_tolerance
    ),
    Contract(
        "penalty-state",
        "sampler",
        "seen = any occurrence in its prompt or output tokens, counts = occurrences in the output only",
        is_penalty_state,
        check_penalty_state,
        fixed(0.0),
        judges_attributes=True,
    ),
    Contract(
        "int8-quantizer",
        "linear",
        "q = round(w / s): |q * s - w| <= s / 2",
        is_int8_quantizer,
        check_int8_quantizer,
        fixed(0.5 + 1e-3),
    ),
    Contract(
        "quantize-model",
        "linear",
        "the siblings it converts are all converted: no float weight matrix left beside a quantized one",
        is_model_quantizer,
        check_model_quantizer,
        fixed(0.0),
        judges_writes=True,
    ),
    Contract(
        "quant-roundtrip",
        "linear",
        "codes in the declared bit range and |(q - zero) * s - w| <= s / 2 per group",
        is_quantizer,
        None,
        fixed(0.5 + 1e-3),
    ),  # check bound per name in contract_check
    Contract(
        "config-fidelity",
        "config",
        "every value config.json states arrives unchanged in the reader's object",
        is_config_reader,
        check_config_reader,
        fixed(1e-6),
        judges_attributes=True,
    ),
]


def contract_for(name: str, params: tuple[str, ...]) -> Contract | None:
    """The role a function plays, from its name (the last part of its qualname) and parameters."""
    short = name.rsplit(".", 1)[-1]
    return next((c for c in CONTRACTS if c.applies(short, params)), None)


def contract_check(contract: Contract, name: str) -> Callable[[dict, object, dict], float | None]:
    if contract.check is not None:
        return contract.check
    short = name.rsplit(".", 1)[-1]
    if contract.name == "quant-roundtrip":
        return check_quant_roundtrip(short)
    return check_mask_builder(short) if contract.name == "attention-mask-4d" else check_gated_activation(short)


def judge(calls, context: dict) -> list[dict]:
    """Recorded calls (tools.engines.functaps.FunctionCall) -> one verdict per function, in the
    order the functions first ran: how many calls were judged, how many broke the contract, the
    largest violation and the tolerance it is measured against."""
    verdicts: dict[str, dict] = {}
    for call in calls:
        contract = contract_for(call.function.rsplit(":", 1)[-1], call.params)
        if contract is None:
            continue
        output = getattr(call, "writes", {}) if contract.judges_writes else call.output
        output = getattr(call, "attributes", {}) if contract.judges_attributes else output
        try:
            size = contract_check(contract, call.function)(call.inputs, output, context)
        except (RuntimeError, ValueError, TypeError, IndexError):  # shapes that do not fit the role
            size = None
        if size is None or math.isnan(size):
            continue
        tol = contract.tolerance(output)
        v = verdicts.setdefault(call.function, new_verdict(call, contract, tol))
        v["inconsistent_inputs"] = max(v["inconsistent_inputs"], inconsistent_inputs(call.inputs))
        v["calls"] += 1
        v["callees"] = sorted(set(v["callees"]) | set(getattr(call, "callees", ())))
        v["settings"] = sorted(set(v["settings"]) | set(settings(call.inputs)))
        v["max_violation"] = max(v["max_violation"], size)
        if size > tol:
            v["violations"] += 1
            v["first_violation"] = call.order if v["first_violation"] is None else v["first_violation"]
    return sorted(verdicts.values(), key=lambda v: v["order"])


def new_verdict(call, contract: Contract, tol: float) -> dict:
    return {
        "function": call.function,
        "contract": contract.name,
        "component": contract.component,
        "rule": contract.rule,
        "calls": 0,
        "violations": 0,
        "max_violation": 0.0,
        "tolerance": tol,
        "order": call.order,
        "first_violation": None,
        "parent": call.parent,
        "callees": [],
        "settings": [],
        "inconsistent_inputs": 0.0,  # largest |softmax(logits) - probs| over the calls handed both
    }


# Scalar parameters that count a size or an index, not a setting of the computation.
NOT_SETTINGS = ("len", "size", "num", "idx", "index", "start", "end", "part", "max", "min_", "step", "pos")


def settings(inputs: dict) -> list[str]:
    """The call's settings: scalar (or unset) parameters such as a window, a scale or a cap."""
    scalar = [k for k, v in inputs.items() if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))]
    return [k for k in scalar if len(k) >= 4 and not any(w in k.lower() for w in NOT_SETTINGS)]


def sampling_context(scenario) -> dict:
    """What the penalty contract needs from the scenario: each request's sampling settings."""
    return {"sampling": [dict(r.sampling or {}) for r in scenario.requests]}
