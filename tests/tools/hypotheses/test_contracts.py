"""Function contracts (tools/hypotheses/contracts.py): a correct implementation of each role keeps its
contract, the silent-bug versions of it break it, and roles are recognised from names and parameters."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tools.hypotheses import contracts as c

torch.manual_seed(0)
X = torch.randn(5, 16)
W = torch.randn(16)


def judge_one(name, params, inputs, output, ctx=None):
    contract = c.contract_for(name, params)
    assert contract is not None, f"{name}{params} not recognised"
    size = c.contract_check(contract, name)(inputs, output, ctx or {})
    return contract, size, contract.tolerance(output)


def rms_norm(x, weight, eps, weight_offset=0.0):  # [T, H] -> [T, H]
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * (weight_offset + weight)).to(x.dtype)


def rms_norm_centered(x, weight, eps, weight_offset=0.0):  # the silent bug: a variance, not a mean square
    xf = x.float()
    return xf * torch.rsqrt(xf.var(-1, keepdim=True, correction=0) + eps) * (weight_offset + weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_kept_by_a_correct_kernel_in_each_dtype(dtype):
    x, w = X.to(dtype), W.to(dtype)
    inputs = {"x": x, "weight": w, "eps": 1e-6, "weight_offset": 0.0}
    contract, size, tol = judge_one("rms_norm", tuple(inputs), inputs, rms_norm(x, w, 1e-6))
    assert contract.name == "rms-norm" and size < tol


def test_rms_norm_broken_by_a_mean_centred_kernel():
    inputs = {"x": X + 0.3, "weight": W, "eps": 1e-6, "weight_offset": 0.0}
    _, size, tol = judge_one("rms_norm", tuple(inputs), inputs, rms_norm_centered(X + 0.3, W, 1e-6))
    assert size > 100 * tol


def test_fused_rms_norm_judges_the_sum_and_the_new_residual():
    res = torch.randn(5, 16)
    inputs = {"x": X, "residual": res, "weight": W, "eps": 1e-6, "weight_offset": 1.0}
    right = (rms_norm(X + res, W, 1e-6, 1.0), X + res)
    assert judge_one("fused_add_rms_norm", tuple(inputs), inputs, right)[1] < 1e-5
    dropped_offset = (rms_norm(X + res, W, 1e-6, 0.0), X + res)  # the offset ignored: (1 + w) became w
    assert judge_one("fused_add_rms_norm", tuple(inputs), inputs, dropped_offset)[1] > 0.1


def test_gated_activations_follow_their_names():
    x = torch.randn(4, 32) * 2
    gate, up = x.chunk(2, -1)
    assert judge_one("silu_and_mul", ("x",), {"x": x}, F.silu(gate) * up)[1] < 1e-6
    tanh = F.gelu(gate, approximate="tanh") * up
    assert judge_one("gelu_tanh_and_mul", ("x",), {"x": x}, tanh)[1] < 1e-6
    _, size, tol = judge_one("gelu_tanh_and_mul", ("x",), {"x": x}, F.gelu(gate) * up)  # exact GELU
    assert size > 5 * tol
    assert judge_one("gelu_and_mul", ("x",), {"x": x}, F.gelu(gate) * up)[1] < 1e-6  # a bare name allows either
    assert judge_one("silu_and_mul", ("x",), {"x": x}, F.silu(up) * gate)[1] > 0.1  # gate and up swapped


def test_softcap():
    s = torch.randn(3, 7) * 20
    inputs = {"scores": s, "softcap": 50.0}
    assert judge_one("_softcap", ("scores", "softcap"), inputs, torch.tanh(s / 50.0) * 50.0)[1] < 1e-6
    assert judge_one("_softcap", ("scores", "softcap"), inputs, torch.tanh(s) * 50.0)[1] > 1.0
    assert judge_one("_softcap", ("scores", "softcap"), {"scores": s, "softcap": None}, s)[1] == 0.0


def test_mask_rule_causal_and_window():
    q, kv = torch.arange(10, 20).view(-1, 1), torch.arange(20).view(1, -1)
    inputs = {"q_pos": q, "kv_pos": kv, "sliding_window": 4}
    right = (kv <= q) & (kv > q - 4)
    assert judge_one("_visible", tuple(inputs), inputs, right)[1] == 0.0
    off_by_one = (kv <= q) & (kv >= q - 4)
    assert judge_one("_visible", tuple(inputs), inputs, off_by_one)[1] > 0.0


def test_rope_tables_and_frequencies():
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    pos = torch.arange(40)
    angles = pos.float()[:, None] * inv_freq[None]
    table = torch.cat((angles.cos() * 1.2, angles.sin() * 1.2), -1)
    inputs = {"inv_freq": inv_freq, "positions": pos, "attention_scaling": 1.2}
    assert judge_one("compute_cos_sin_cache", tuple(inputs), inputs, table)[1] < 1e-5
    unscaled = torch.cat((angles.cos(), angles.sin()), -1)
    assert judge_one("compute_cos_sin_cache", tuple(inputs), inputs, unscaled)[1] > 0.1
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    inputs = {"rope": rope, "dim": 16, "max_pos": 1024, "seq_len": None}
    assert judge_one("dynamic_ntk_inv_freq", tuple(inputs), inputs, (inv_freq, 1.0))[1] < 1e-6
    grown = 1.0 / ((10000 * 3.0 ** (16 / 14)) ** (torch.arange(0, 16, 2).float() / 16))
    assert judge_one("dynamic_ntk_inv_freq", tuple(inputs), inputs, (grown, 1.0))[1] > 0.01


def test_rotary_rotation():
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    angles = torch.arange(32).float()[:, None] * inv_freq[None]
    cache = torch.cat((angles.cos(), angles.sin()), -1)  # [32, 8]
    pos, q, k = torch.tensor([3, 4, 5]), torch.randn(3, 16), torch.randn(3, 8)

    def rotate(x, p):
        xs = x.view(3, -1, 8)
        cos, sin = cache[p].chunk(2, -1)
        cos, sin = torch.cat((cos, cos), -1)[:, None], torch.cat((sin, sin), -1)[:, None]
        return (xs * cos + torch.cat((-xs[..., 4:], xs[..., :4]), -1) * sin).reshape(x.shape)

    inputs = {"positions": pos, "query": q, "key": k, "cos_sin_cache": cache, "head_dim": 8}
    assert judge_one("rotary_embedding", tuple(inputs), inputs, (rotate(q, pos), rotate(k, pos)))[1] < 1e-6
    shifted = (rotate(q, pos - pos[0]), rotate(k, pos - pos[0]))  # positions restarted at 0
    assert judge_one("rotary_embedding", tuple(inputs), inputs, shifted)[1] > 0.1


def test_sampler_cuts_and_penalty():
    logits = torch.randn(2, 50) * 3
    kth = logits.sort(-1, descending=True).values[:, 4:5]
    inputs = {"logits": logits, "top_k": torch.tensor([5, 5])}
    assert judge_one("apply_top_k", tuple(inputs), inputs, logits.masked_fill(logits < kth, -math.inf))[1] == 0
    kth6 = logits.sort(-1, descending=True).values[:, 5:6]  # keeps k + 1
    assert judge_one("apply_top_k", tuple(inputs), inputs, logits.masked_fill(logits < kth6, -math.inf))[1] > 0
    probs = logits.softmax(-1)
    inputs = {"logits": logits, "min_p": torch.tensor([0.1, 0.1])}
    right = logits.masked_fill(probs < 0.1 * probs.amax(-1, keepdim=True), -math.inf)
    assert judge_one("apply_min_p", tuple(inputs), inputs, right)[1] == 0
    seen = torch.zeros_like(logits, dtype=torch.bool)
    seen[:, :10] = True
    ctx = {"sampling": [{"repetition_penalty": 1.3}]}
    hf = torch.where(seen, torch.where(logits > 0, logits / 1.3, logits * 1.3), logits)
    inputs = {"logits": logits, "st": None}
    assert judge_one("apply_penalties", ("logits", "st"), inputs, hf, ctx)[1] == 0
    divided = torch.where(seen, logits / 1.3, logits)  # negative logits raised
    _, size, tol = judge_one("apply_penalties", ("logits", "st"), inputs, divided, ctx)
    assert size > tol
    negative = {"sampling": [{"presence_penalty": -0.5}]}  # may raise on purpose: not judged
    assert judge_one("apply_penalties", ("logits", "st"), inputs, divided, negative)[1] is None


def test_int8_quantizer():
    w = torch.randn(6, 32)
    s = w.abs().amax(-1) / 127
    right = (torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8), s)
    _, size, tol = judge_one("quantize_per_channel_int8", ("w",), {"w": w}, right)
    assert size <= tol
    truncated = ((w / s[:, None]).clamp(-127, 127).to(torch.int8), s)
    assert judge_one("quantize_per_channel_int8", ("w",), {"w": w}, truncated)[1] > tol


def test_roles_are_recognised_by_name_and_parameters_only():
    assert c.contract_for("Anything.rms_norm", ("hidden", "weight", "variance_epsilon")).name == "rms-norm"
    assert c.contract_for("forward", ("x",)) is None
    assert c.contract_for("apply_top_p", ("logits", "top_p")).name == "top-p"
    assert c.contract_for("dequantize_int8", ("q", "scale")) is None


def test_a_call_that_does_not_fit_its_role_is_not_judged():
    inputs = {"x": X, "weight": torch.randn(3), "eps": 1e-6}  # weight of the wrong width
    verdicts = c.judge(
        [
            type(
                "Call",
                (),
                {
                    "function": "m.py:rms_norm",
                    "params": tuple(inputs),
                    "inputs": inputs,
                    "output": X,
                    "parent": None,
                    "order": 0,
                    "callees": set(),
                },
            )()
        ],
        {},
    )
    assert verdicts == []


# ---- attention over a paged KV cache: a small kernel in the shared layout, right and with the
# decode query position one past the token (the split-KV slip), judged from its own inputs.

BS, KVH, GROUP, D = 4, 2, 2, 8


def paged_cache(lens: list[int], dtype=torch.float32):
    """A cache [NB, BS, KVH, D] whose sequences own shuffled blocks; tables [B, M]."""
    per_seq = [-(-n // BS) for n in lens]
    order = torch.randperm(sum(per_seq) + 2)[: sum(per_seq)]
    tables = torch.zeros(len(lens), max(per_seq), dtype=torch.long)
    at = 0
    for s, m in enumerate(per_seq):
        tables[s, :m], at = order[at : at + m], at + m
    shape = (sum(per_seq) + 2, BS, KVH, D)
    return torch.randn(shape).to(dtype), torch.randn(shape).to(dtype), tables


def decode_kernel(
    q, key_cache, value_cache, block_tables, seq_lens, scale, sliding_window, p0=0, part=None, position_slip=0
):  # q [B, H, D] -> [B, H, D] (or (out, lse) over keys [p0, p0 + part))
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        pos = torch.arange(p0, max(p0, min(n, p0 + part)) if part else n)
        k = key_cache[block_tables[b][pos // BS], pos % BS].float().repeat_interleave(GROUP, 1)
        v = value_cache[block_tables[b][pos // BS], pos % BS].float().repeat_interleave(GROUP, 1)
        s = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        q_pos = n - 1 + position_slip
        s = s.masked_fill(~((pos <= q_pos) & (pos > q_pos - (sliding_window or 10**9))), float("-inf"))
        lses.append(torch.logsumexp(s, -1))
        outs.append(torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v))
    out = torch.stack(outs).to(q.dtype)
    return (out, torch.stack(lses)) if part else out


def judge_decode(dtype, **kernel):
    lens = [13, 7, 16]
    kc, vc, tables = paged_cache(lens, dtype)
    q = torch.randn(3, KVH * GROUP, D).to(dtype)
    inputs = {
        "q": q,
        "key_cache": kc,
        "value_cache": vc,
        "block_tables": tables,
        "seq_lens": torch.tensor(lens),
        "scale": D**-0.5,
        "sliding_window": 6,
    }
    extra = {k: kernel[k] for k in ("p0", "part") if k in kernel}
    name = "decode_partition" if extra else "paged_attention_decode"
    return judge_one(name, tuple(inputs) + tuple(extra), {**inputs, **extra}, decode_kernel(**inputs, **kernel))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_kept_by_a_correct_kernel_and_broken_by_a_query_position_slip(dtype):
    contract, size, tol = judge_decode(dtype)
    assert contract.name == "paged-attention" and size < tol / 4
    assert judge_decode(dtype, position_slip=1)[1] > 10 * tol


def test_a_split_kv_partition_is_judged_over_its_own_key_range():
    assert judge_decode(torch.float32, p0=8, part=8)[1] < 1.0
    assert judge_decode(torch.float32, p0=8, part=8, position_slip=1)[1] > 10 * c.THRESHOLD
    kc, vc, tables = paged_cache([9])
    inputs = {"q": torch.randn(1, 4, D), "key_cache": kc, "value_cache": vc, "block_tables": tables}
    partial = (torch.randn(1, 4, D), torch.randn(1, 4))  # a partial result with no readable key range
    assert c.check_paged_attention({**inputs, "seq_lens": torch.tensor([9]), "chunk": 3}, partial, {}) is None


def test_packed_prefill_rows_sit_at_the_end_of_their_sequence():
    lens, q_lens = [10, 6], [4, 6]
    kc, vc, tables = paged_cache(lens)
    q = torch.randn(sum(q_lens), KVH * GROUP, D)
    starts = torch.tensor([0, 4, 10])
    want = torch.cat(
        [
            c.attention_ref(
                q[a:b],
                c.gather_paged(kc, tables[s], torch.arange(n)),
                c.gather_paged(vc, tables[s], torch.arange(n)),
                torch.arange(n - (b - a), n),
                torch.arange(n),
                D**-0.5,
                None,
                None,
            )[0]
            for s, (a, b, n) in enumerate([(0, 4, 10), (4, 10, 6)])
        ]
    ).float()
    inputs = {
        "query": q,
        "key_cache": kc,
        "value_cache": vc,
        "query_start_loc": starts,
        "seq_lens": torch.tensor(lens),
        "block_tables": tables,
        "scale": D**-0.5,
    }
    assert judge_one("paged_attention", tuple(inputs), inputs, want)[1] < 1.0
    shifted = want.clone()
    shifted[4:10] = want[4:10].roll(1, 0)  # rows of the second sequence one position off
    assert judge_one("paged_attention", tuple(inputs), inputs, shifted)[1] > 10 * c.THRESHOLD
    writer = c.contract_for("write_to_kv_cache", ("key", "value", "key_cache", "value_cache", "slot_mapping"))
    assert writer is not None and writer.name == "kv-cache-write"  # a writer is no attention kernel


# ---------------------------------------------------------------- 4D mask builders


def additive_mask(pad, q_pos, n_keys, window, dtype=torch.float32, band_shift=0):
    """A builder's [B, 1, Q, K] additive mask (0 visible, dtype min hidden); band_shift moves the window
    edge by that many keys (the off-by-one bug)."""
    kv = torch.arange(n_keys)[None, :]
    seen = kv <= q_pos[:, None]
    if window is not None:
        seen &= kv > q_pos[:, None] - window - band_shift
    seen = seen[None] & (pad[:, None, :n_keys] != 0)
    return torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)[:, None]


MASK_PARAMS = ("attention_mask", "input_shape", "inputs_embeds", "past_key_values_length", "sliding_window")


def mask_call(pad, past, q_len, window):
    return {
        "attention_mask": pad,
        "input_shape": (pad.shape[0], q_len),
        "inputs_embeds": torch.zeros(pad.shape[0], q_len, 4),
        "past_key_values_length": past,
        "sliding_window": window,
    }


def test_mask_builder_kept_by_causal_window_and_padding_and_broken_by_each_slip():
    pad = torch.ones(2, 40, dtype=torch.long)
    pad[1, :5] = 0  # left padding of the shorter request
    q_pos = torch.arange(40)
    name = "_prepare_4d_causal_attention_mask"
    inputs = mask_call(pad, 0, 40, 16)
    assert judge_one(name, MASK_PARAMS, inputs, additive_mask(pad, q_pos, 40, 16))[1] == 0.0
    assert judge_one(name, MASK_PARAMS, inputs, additive_mask(pad, q_pos, 40, 16, band_shift=1))[1] > 0
    assert judge_one(name, MASK_PARAMS, inputs, additive_mask(pad, q_pos, 40, None))[1] > 0
    assert judge_one(name, MASK_PARAMS, inputs, additive_mask(torch.ones_like(pad), q_pos, 40, 16))[1] > 0
    boolean = additive_mask(pad, q_pos, 40, 16) == 0  # True: visible
    assert judge_one(name, MASK_PARAMS, inputs, boolean)[1] == 0.0


def test_decode_step_mask_is_judged_at_its_cache_position():
    pad = torch.ones(1, 41, dtype=torch.long)
    params = ("attention_mask", "input_tensor", "cache_position", "past_key_values", "output_attentions")
    inputs = {"attention_mask": pad, "input_tensor": torch.zeros(1, 1, 4), "cache_position": torch.tensor([40])}
    ctx = {"attention_windows": [16, 16]}
    right = additive_mask(pad, torch.tensor([40]), 41, 16)
    assert judge_one("_update_causal_mask", params, inputs, right, ctx)[1] == 0.0
    # None: the attention applies plain causality itself, which sees all 41 keys, not the last 16
    assert judge_one("_update_causal_mask", params, inputs, None, ctx)[1] == pytest.approx(25 / 41)
    assert judge_one("_update_causal_mask", params, inputs, None, {"attention_windows": [None, None]})[1] == 0.0


def test_the_window_a_mask_must_carry_comes_from_its_argument_or_the_layers():
    given_none = {"sliding_window": None}
    assert c.expected_window("build_mask", {"sliding_window": 8}, {"attention_windows": [None]}) == (True, 8)
    assert c.expected_window("build_mask", given_none, {}) == (False, None)  # nothing says: not judged
    assert c.expected_window("build_mask", given_none, {"attention_windows": [32, 32]}) == (True, 32)
    mixed = {"attention_windows": [None, 32]}
    assert c.expected_window("build_mask", given_none, mixed) == (True, None)  # one mask for every layer: full
    assert c.expected_window("create_sliding_window_causal_mask", {}, mixed) == (True, 32)
    per_kind = {"attention_windows": [32, 32], "masks_per_layer_kind": True}
    assert c.expected_window("create_causal_mask", {}, per_kind) == (True, None)


def test_a_passed_through_4d_mask_or_a_decision_is_not_judged():
    pad4d = torch.zeros(1, 1, 8, 8)
    inputs = {**mask_call(torch.ones(1, 8), 0, 8, 4), "attention_mask": pad4d}
    assert judge_one("_prepare_4d_causal_attention_mask", MASK_PARAMS, inputs, pad4d)[1] is None
    decision = ("attention_mask", "inputs_embeds", "past_key_values_length", "sliding_window", "is_training")
    inputs = {"attention_mask": None, "inputs_embeds": torch.zeros(1, 8, 4), "past_key_values_length": 0}
    assert judge_one("_ignore_causal_mask_sdpa", decision, inputs, True)[1] is None


def hf_config(**rope) -> dict:
    return {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
        "rope_scaling": rope,
    }


def test_rope_frequencies_from_a_config_dict():
    from tools.refmodels import rope as rope_ref

    params = ("config", "device", "seq_len")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    rope = {**yarn, "rope_theta": 10000.0}
    want = rope_ref.frequencies(rope, 16, 1024, 1024, torch.float64)
    inputs = {"config": hf_config(**yarn), "device": None, "seq_len": None}
    contract, size, tol = judge_one("_compute_yarn_parameters", params, inputs, (want[0].float(), want[1]))
    assert contract.name == "rope-config-frequencies" and size < tol
    # the correction band taken from max_position_embeddings instead of the pretraining context
    wrong = rope_ref.frequencies({**rope, "original_max_position_embeddings": 1024}, 16, 1024, 1024, torch.float64)
    assert judge_one("_compute_yarn_parameters", params, inputs, (wrong[0].float(), wrong[1]))[1] > 100 * tol
    unreadable = {"config": {"rope_scaling": yarn}, "device": None, "seq_len": None}
    assert judge_one("_compute_yarn_parameters", params, unreadable, want)[1] is None
