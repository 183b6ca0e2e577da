"""tinyserve weight-only quantization (int8 per channel, int4 per group) against diffdx's own math
and against transformers running the same dequantized weights."""

import pytest
import torch
from safetensors.torch import load_file
from tinyserve import LLMEngine, SamplingParams
from tinyserve.ops import KERNELS
from tinyserve.ops.quant_matmul import dequant_matmul, dequant_matmul_native, dequantize_weight
from tinyserve.quantization import quantize_group_int4, quantize_per_channel_int8

from benchmark.subjects import check_tinyserve  # noqa: F401  (puts the subject on sys.path)
from tools.probe import quant
from tools.probe.checkpoints import ensure_checkpoint, reference_checkpoint
from tools.probe.prober import Prober
from tools.scenario import from_dict

torch.set_num_threads(1)
SHAPES = [(48, 64), (7, 32), (128, 96), (3, 256)]


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_agrees_bit_for_bit_with_diffdx(shape):
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[0])) * 0.05
    w[0] = 0.0  # an all-zero row must not divide by zero
    q, s = quant.quantize_int8(w)
    q2, s2 = quantize_per_channel_int8(w)
    assert torch.equal(q, q2) and torch.equal(s, s2)
    assert torch.equal(quant.dequantize_int8(q, s), dequantize_weight(q2, s2, None, 0))
    assert (quant.round_trip(w, "int8") - w).abs().max() <= s.max() / 2 + 1e-9


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("group", [16, 32])
def test_int4_agrees_bit_for_bit_with_diffdx(shape, group):
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(group)) * 0.05 + 0.01
    packed, s, z = quant.quantize_int4(w, group)
    packed2, s2, z2 = quantize_group_int4(w, group)
    assert torch.equal(packed, packed2) and torch.equal(s, s2) and torch.equal(z, z2)
    assert packed.dtype == torch.uint8 and packed.shape == (shape[0], shape[1] // 2)
    assert torch.equal(quant.dequantize_int4(packed, s, z, group), dequantize_weight(packed2, s2, z2, group))
    err = (quant.round_trip(w, "int4", group) - w).abs().reshape(shape[0], -1, group).amax(-1)
    assert bool((err <= s * 0.5 + 1e-6).all())


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_dequant_matmul_matches_its_native_twin(scheme):
    g = torch.Generator().manual_seed(1)
    w, x, bias = torch.randn(24, 64, generator=g), torch.randn(5, 64, generator=g), torch.randn(24, generator=g)
    args = (*quantize_per_channel_int8(w), None, 0) if scheme == "int8" else (*quantize_group_int4(w, 32), 32)
    fast, native = dequant_matmul(x, *args, bias=bias), dequant_matmul_native(x, *args, bias=bias)
    torch.testing.assert_close(fast, native, rtol=1e-5, atol=1e-5)
    ref = x @ dequantize_weight(*args).T + bias
    torch.testing.assert_close(native, ref, rtol=1e-6, atol=1e-6)
    assert "dequant_matmul" in KERNELS


def test_engine_quantizes_decoder_linears_only_and_native_twin_gives_same_tokens():
    ckpt = str(ensure_checkpoint({"arch": "llama", "seed": 0}))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    runs = {}
    for native in ((), ("dequant_matmul",)):
        engine = LLMEngine.from_options(ckpt, quantization="int4", native_kernels=native)
        layer = engine.model_runner.model.model.layers[0]
        assert layer.self_attn.qkv_proj.quant.qweight.dtype == torch.uint8
        assert not hasattr(layer.mlp.down_proj, "weight") and layer.mlp.down_proj.quant is not None
        assert engine.model_runner.model.model.embed_tokens.weight.dtype == torch.float32
        engine.add_request("0", list(range(20, 50)), params)
        while engine.has_unfinished_requests():
            outs = engine.step()
        runs[native] = outs[0].token_ids
    assert runs[()] == runs[("dequant_matmul",)]


def test_reference_checkpoint_is_dequantized_once_and_keyed_by_scheme():
    sc = scenario("llama", "float32", "int4", quant_group_size=16)
    weights = {"scheme": "int4", "group_size": 16}  # what the adapter reports (test below)
    path = reference_checkpoint(sc.model, weights)
    assert path.name.endswith("dequant-int4-g16") and reference_checkpoint(sc.model, weights) == path
    assert reference_checkpoint(sc.model, None) == ensure_checkpoint(sc.model)
    tensors, original = (
        load_file(str(path / "model.safetensors")),
        load_file(str(ensure_checkpoint(sc.model) / "model.safetensors")),
    )
    name = "model.layers.0.self_attn.k_proj.weight"
    assert torch.equal(tensors[name], quant.round_trip(original[name], "int4", 16))
    assert torch.equal(tensors["model.embed_tokens.weight"], original["model.embed_tokens.weight"])


def scenario(arch, dtype, scheme, **options):
    reqs = [
        {"prompt_ids": list(range(40, 76)), "max_tokens": 6, "sampling": {"ignore_eos": True}},
        {
            "prompt_ids": list(range(300, 311)),
            "max_tokens": 5,
            "arrival_step": 1,
            "sampling": {"ignore_eos": True, "temperature": 0.7, "seed": 2},
        },
    ]
    return from_dict(
        {
            "model": {"arch": arch, "seed": 0},
            "target": {"engine": "tinyserve", "dtype": dtype, "options": {"quantization": scheme, **options}},
            "workload": {"requests": reqs},
        }
    )


@pytest.mark.parametrize(
    "arch,dtype,scheme", [("llama", "float32", "int4"), ("gemma2", "bfloat16", "int8"), ("qwen2", "float32", "int8")]
)
def test_probe_finds_no_divergence_against_dequantized_reference(arch, dtype, scheme):
    result = Prober().probe(scenario(arch, dtype, scheme, block_size=4, prefix_caching=True))
    assert result.divergent_taps == [] and not result.diverged, result.summary


def test_probe_sees_quantization_error_against_the_float_checkpoint():
    """Without the dequantized reference, int4 error is far above fp32 noise: the hook matters."""
    from tools.probe.prober import compare_traces

    sc = scenario("llama", "float32", "int4")
    prober = Prober()
    target = prober.run_target(sc, None)
    assert target.meta["weights"] == {"scheme": "int4", "group_size": 32}  # the adapter says what to mirror
    high = prober.run_reference(sc, "float64", target.sequences(), None)  # no weights: the float checkpoint
    low = prober.run_reference(sc, "float32", target.sequences(), None)
    assert compare_traces(sc, target, low, high).divergent_taps
