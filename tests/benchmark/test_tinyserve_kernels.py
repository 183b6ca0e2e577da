"""Every optimized tinyserve kernel equals its native twin on randomized shapes."""

import pytest
import torch
from tinyserve import ops
from tinyserve.layers.rotary_embedding import ROPE_SCALING, compute_cos_sin_cache

from benchmark.subjects import check_tinyserve  # noqa: F401  (puts the subject on sys.path)

torch.set_num_threads(1)
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float64: 1e-10}


def twins(name):
    return ops.get_kernel(name), ops.get_kernel(name, native=True)


def close(a, b, dtype):
    torch.testing.assert_close(a.double(), b.double(), atol=TOL[dtype], rtol=TOL[dtype])


def test_kernel_registry():
    assert set(ops.KERNELS) >= {
        "fused_add_rms_norm",
        "rotary_embedding",
        "silu_and_mul",
        "gelu_tanh_and_mul",
        "paged_attention",
    }
    ks = ops.select_kernels(["paged_attention"])
    assert ks.paged_attention is ops.get_kernel("paged_attention", native=True)
    assert ks.silu_and_mul is ops.get_kernel("silu_and_mul")
    with pytest.raises(KeyError, match="known"):
        ops.select_kernels(["flash_attn"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_norms(dtype, offset):
    g = torch.Generator().manual_seed(0)
    for t, h in [(1, 8), (7, 64), (33, 96)]:
        x, res = torch.randn(t, h, generator=g).to(dtype), torch.randn(t, h, generator=g).to(dtype)
        w = (torch.randn(h, generator=g) * 0.1 + (0 if offset else 1)).to(dtype)
        opt, nat = twins("rms_norm")
        close(opt(x, w, 1e-6, offset), nat(x, w, 1e-6, offset), dtype)
        opt, nat = twins("fused_add_rms_norm")
        y_opt, r_opt = opt(x.clone(), res.clone(), w, 1e-6, offset)  # in place: give it copies
        y_nat, r_nat = nat(x, res, w, 1e-6, offset)
        close(r_opt, r_nat, dtype)
        close(y_opt, y_nat, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary(dtype):
    g = torch.Generator().manual_seed(1)
    for t, heads, kv, d in [(5, 4, 2, 16), (40, 8, 8, 32)]:
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        cache = compute_cos_sin_cache(inv_freq, torch.arange(256), 1.0)
        pos = torch.randint(0, 256, (t,), generator=g)
        q, k = torch.randn(t, heads * d, generator=g).to(dtype), torch.randn(t, kv * d, generator=g).to(dtype)
        opt, nat = twins("rotary_embedding")
        for a, b in zip(opt(pos, q, k, cache, d), nat(pos, q, k, cache, d)):
            close(a, b, dtype)


@pytest.mark.parametrize("name", ["silu_and_mul", "gelu_tanh_and_mul"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_activations(name, dtype):
    g = torch.Generator().manual_seed(2)
    for t, i in [(1, 4), (19, 128)]:
        x = (torch.randn(t, 2 * i, generator=g) * 3).to(dtype)
        opt, nat = twins(name)
        close(opt(x), nat(x), dtype)


def random_paged_batch(g, q_lens, ctx_lens, block_size, heads=4, kv_heads=2, d=16, num_blocks=120):
    """A packed batch over a cache whose blocks are scattered at random."""
    kc = torch.randn(num_blocks, block_size, kv_heads, d, generator=g)
    vc = torch.randn(num_blocks, block_size, kv_heads, d, generator=g)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables = []
    for n in ctx_lens:
        need = -(-n // block_size)
        tables.append([perm.pop() for _ in range(need)])
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    starts = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()))
    q = torch.randn(int(starts[-1]), heads, d, generator=g)
    return q, kc, vc, starts, torch.tensor(ctx_lens), block_tables


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("window,softcap", [(None, None), (32, None), (None, 50.0), (32, 50.0)])
def test_paged_attention(block_size, window, softcap):
    g = torch.Generator().manual_seed(3)
    # decodes (q_len 1, contexts beyond one 64-token partition), a first chunk, a later chunk
    q_lens, ctx_lens = [1, 17, 1, 24, 1], [150, 17, 9, 70, 65]
    q, kc, vc, starts, seq_lens, tables = random_paged_batch(g, q_lens, ctx_lens, block_size)
    opt, nat = twins("paged_attention")
    a = opt(q, kc, vc, starts, seq_lens, tables, 0.25, window, softcap)
    b = nat(q, kc, vc, starts, seq_lens, tables, 0.25, window, softcap)
    close(a, b, torch.float32)


def test_paged_attention_bf16_cache():
    g = torch.Generator().manual_seed(4)
    q, kc, vc, starts, seq_lens, tables = random_paged_batch(g, [1, 30], [100, 45], 16)
    q, kc, vc = q.bfloat16(), kc.bfloat16(), vc.bfloat16()
    opt, nat = twins("paged_attention")
    close(
        opt(q, kc, vc, starts, seq_lens, tables, 0.25, 32, None),
        nat(q, kc, vc, starts, seq_lens, tables, 0.25, 32, None),
        torch.bfloat16,
    )


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    ],
)
def test_rope_scaling_matches_transformers(rope):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=16,
        max_position_embeddings=256,
        rope_parameters={"rope_theta": 10000.0, **rope},
    )
    expected, expected_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")
    params = {"rope_theta": 10000.0, **rope}
    params.setdefault("original_max_position_embeddings", 256)
    got, scale = ROPE_SCALING[rope["rope_type"]](params, 16, 256)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert scale == pytest.approx(expected_scale)
