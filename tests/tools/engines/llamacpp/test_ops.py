"""The ggml ops recomputed in fp64 (tools/engines/llamacpp/ops.py), on hand-built inputs with known answers."""

import math
import struct

import pytest
import torch

from tools.engines.llamacpp import ops
from tools.engines.llamacpp.ops import OpCall, Operand

F64 = torch.float64


def t4(*rows) -> torch.Tensor:
    """A [1, 1, R, D] tensor from rows."""
    return torch.tensor(rows, dtype=F64)[None, None]


def rope_params(n_dims: int, mode: int, base: float = 10000.0, freq_scale: float = 1.0, ext: float = 0.0) -> bytes:
    return struct.pack("<5i6f", 0, n_dims, mode, 0, 4096, base, freq_scale, ext, 1.0, 32.0, 1.0)


def test_mul_mat_is_b_times_a_transposed_with_grouped_heads():
    a = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]], [[[0.0, 1.0], [1.0, 0.0]]]], dtype=F64)  # [A3=2, A2=1, M=2, K=2]
    b = torch.ones(2, 2, 1, 2, dtype=F64)  # two "heads" share each a batch
    out = ops.mul_mat(a, b)
    assert out.shape == (2, 2, 1, 2)
    assert out[0, 1, 0].tolist() == [3.0, 7.0] and out[1, 0, 0].tolist() == [1.0, 1.0]


def test_binary_ops_tile_the_smaller_operand():
    a = torch.zeros(1, 1, 2, 4, dtype=F64)
    b = torch.tensor([1.0, 2.0], dtype=F64).reshape(1, 1, 1, 2)
    assert ops.tile_to(b, a.shape)[0, 0, 1].tolist() == [1.0, 2.0, 1.0, 2.0]


def test_rms_norm_and_norm():
    assert ops.rms_norm(t4([3.0, 4.0]), 0.0)[0, 0, 0].tolist() == pytest.approx(
        [3 / math.sqrt(12.5), 4 / math.sqrt(12.5)]
    )
    assert ops.layer_norm(t4([1.0, 3.0]), 0.0)[0, 0, 0].tolist() == pytest.approx([-1.0, 1.0])


def test_rope_normal_rotates_adjacent_pairs_and_neox_rotates_halves():
    x = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=F64).reshape(1, 1, 1, 4)  # [B, T, H, D]
    pos = torch.tensor([1])
    normal = ops.rope(x, pos, ops.Rope(4, 0, 4096, 100.0, 1.0, 0.0, 1.0, 32.0, 1.0))[0, 0, 0]
    # pairs (x0, x1) at angle 1, (x2, x3) at angle 100^(-1/2) = 0.1
    assert normal.tolist() == pytest.approx([math.cos(1), math.sin(1), -math.sin(0.1), math.cos(0.1)])
    neox = ops.rope(x, pos, ops.Rope(4, 2, 4096, 100.0, 1.0, 0.0, 1.0, 32.0, 1.0))[0, 0, 0]
    # pairs (x0, x2) at angle 1, (x1, x3) at angle 0.1
    assert neox.tolist() == pytest.approx([math.cos(1), -math.sin(0.1), math.sin(1), math.cos(0.1)])


def test_rope_reads_its_params_and_keeps_dims_past_n_dims():
    x = torch.arange(1.0, 7.0, dtype=F64).reshape(1, 1, 1, 6)
    call = OpCall("ROPE", "Qcur-0", "f32", x, (Operand("f32", x), Operand("i32", torch.tensor([[[[2]]]]))))
    call.op_params = rope_params(4, 2, base=10000.0, freq_scale=0.5)
    r = ops.Rope.of(call)
    assert (r.n_dims, r.mode, r.freq_base, r.freq_scale) == (4, 2, 10000.0, 0.5)
    out = ops.recompute(call)
    assert out is not None and out[0, 0, 0, 4:].tolist() == [5.0, 6.0]
    # linear scaling: position 2 at freq_scale 0.5 turns like position 1 unscaled
    assert out[0, 0, 0, 0].item() == pytest.approx(1 * math.cos(1) - 3 * math.sin(1), rel=1e-6)


def test_rope_yarn_ramps_between_interpolation_and_extrapolation():
    r = ops.Rope(8, 2, 64, 10000.0, 0.25, 1.0, 1.0, 32.0, 1.0)
    theta, mscale = ops.rope_angles(torch.tensor([1]), r, None)
    low, high = ops.yarn_corr_dims(8, 64, 10000.0, 32.0, 1.0)
    assert low <= high and mscale.item() == pytest.approx(1 + 0.1 * math.log(4))
    plain = 10000.0 ** (-2.0 * torch.arange(4) / 8)
    assert theta[0, 0].item() == pytest.approx(plain[0].item())  # fast dims keep their frequency
    assert theta[0, -1].item() == pytest.approx(0.25 * plain[-1].item())  # slow dims are interpolated


def test_soft_max_with_mask_scale_and_alibi():
    x = torch.zeros(1, 8, 1, 3, dtype=F64)
    mask = torch.tensor([0.0, -1.0, float("-inf")], dtype=F64).reshape(1, 1, 1, 3)
    out = ops.soft_max(x, mask, 2.0, 8.0)
    # ALiBi with 8 heads and max_bias 8: slope of head h is 2^-(h+1)
    for h in range(8):
        w = torch.tensor([1.0, math.exp(-(2.0 ** -(h + 1))), 0.0])
        assert out[0, h, 0].tolist() == pytest.approx((w / w.sum()).tolist())
    assert ops.soft_max(x[:, :1], None, 1.0, 0.0)[0, 0, 0].tolist() == pytest.approx([1 / 3] * 3)


def test_soft_max_sink_takes_its_share():
    out = ops.soft_max(torch.zeros(1, 1, 1, 2, dtype=F64), None, 1.0, 0.0, torch.zeros(1, dtype=F64))
    assert out[0, 0, 0].tolist() == pytest.approx([1 / 3, 1 / 3])


def test_flash_attn_equals_softmax_then_weighted_values():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 4, generator=g, dtype=F64) for h, n in ((4, 3), (2, 5), (2, 5)))
    mask = torch.zeros(1, 1, 3, 5, dtype=F64)
    mask[..., 4] = float("-inf")
    out = ops.flash_attn(q, k, v, mask, 0.5, 0.0, 0.0)  # [B, N, H, Dv]
    kk = k.repeat_interleave(2, 1)
    p = ops.soft_max(ops.mul_mat(kk, q), mask, 0.5, 0.0)
    assert torch.allclose(out, (p @ v.repeat_interleave(2, 1)).transpose(1, 2))


def test_glu_fused_and_split_and_swapped():
    gate, up = torch.tensor([1.0, -2.0], dtype=F64), torch.tensor([3.0, 4.0], dtype=F64)
    want = (gate * torch.sigmoid(gate) * up).tolist()
    assert ops.glu(torch.cat((gate, up)), None, "SILU", False).tolist() == pytest.approx(want)
    assert ops.glu(up, gate, "SILU", True).tolist() == pytest.approx(want)
    assert ops.glu(torch.cat((up, gate)), None, "SILU", True).tolist() == pytest.approx(want)


def test_get_rows_and_set_rows():
    table = torch.arange(6.0, dtype=F64).reshape(1, 1, 3, 2)
    idx = torch.tensor([2, 0]).reshape(1, 1, 1, 2)
    assert ops.get_rows(table, idx)[0, 0].tolist() == [[4.0, 5.0], [0.0, 1.0]]
    cache = torch.zeros(1, 1, 4, 2, dtype=F64)
    rows = torch.tensor([[7.0, 8.0]], dtype=F64).reshape(1, 1, 1, 2)
    assert ops.set_rows(cache, rows, torch.tensor([3]).reshape(1, 1, 1, 1))[0, 0, 3].tolist() == [7.0, 8.0]
    two = torch.tensor([[1.0, 1.0], [2.0, 2.0]], dtype=F64).reshape(1, 2, 1, 2)  # one row for each of 2 streams
    out = ops.set_rows(torch.zeros(1, 2, 3, 2, dtype=F64), two, torch.tensor([[0], [2]]).reshape(1, 1, 2, 1))
    assert out[0, 0, 0].tolist() == [1.0, 1.0] and out[0, 1, 2].tolist() == [2.0, 2.0] and out[0, 1, 0].sum() == 0


def test_permute_follows_ggml_axes():
    x = torch.arange(24.0).reshape(2, 3, 4, 1)  # ne = [1, 4, 3, 2]
    assert ops.permute(x, (0, 2, 1, 3)).shape == (2, 4, 3, 1)  # ne1 <-> ne2
    assert torch.equal(ops.permute(x, (0, 2, 1, 3)), x.transpose(1, 2))
    assert torch.equal(ops.permute(x, (1, 0, 2, 3)), x.transpose(2, 3))


def test_q8_0_quantization_keeps_the_block_max_exact():
    x = torch.linspace(-1.0, 1.0, 32, dtype=F64)
    q = ops.quantize_q8(x, 32, fp16_scale=True)
    d = torch.tensor(1 / 127).to(torch.float16).double()
    assert q[-1].item() == pytest.approx(127 * d.item()) and (q - x).abs().max() <= 0.5 / 127 + 1e-3


def test_judge_passes_a_correct_op_and_flags_a_wrong_one():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 1, 4, 16, generator=g, dtype=F64)
    eps = struct.pack("<f", 1e-6)
    good = ops.rms_norm(x, 1e-6).float()
    call = OpCall("RMS_NORM", "attn_norm-0", "f32", good, (Operand("f32", x),), eps)
    verdict = ops.judge(call, 0)
    assert verdict is not None and not verdict.wrong() and verdict.ratio < 1.0
    bad = good.clone()
    bad[0, 0, 2] *= 1.01  # one row 1 % off
    wrong = ops.judge(OpCall("RMS_NORM", "attn_norm-1", "f32", bad, (Operand("f32", x),), eps), 1)
    assert wrong is not None and wrong.wrong() and wrong.ratio > 100
    assert ops.first_wrong([wrong, verdict]) is wrong


def test_mul_mat_recompute_emulates_the_f16_activation_rounding():
    """ggml converts src1 to fp16 for an f16 weight: that rounding is by design, not a wrong op."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(1, 1, 8, 64, generator=g).half().double()
    x = torch.randn(1, 1, 3, 64, generator=g, dtype=F64)
    engine = ops.mul_mat(w, x.half().double()).float()
    call = OpCall("MUL_MAT", "Qcur-0", "f32", engine, (Operand("f16", w), Operand("f32", x)))
    verdict = ops.judge(call, 0)
    assert verdict is not None and verdict.ratio < 1.0
