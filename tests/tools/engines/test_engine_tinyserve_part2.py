"""The probe on tinyserve's part-2 features: quantized, speculative and tensor-parallel targets show
zero divergent taps against their reference; a detokenization error shows as the `detokenizer` tap."""

import pytest

from tools.engines.tinyserve import TinyServeEngine
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.prober import TEXT_TAP, Prober, compare_traces, text_divergence
from tools.probe.trace import RequestOutput, Trace
from tools.scenario import from_dict

LOOP = list(range(100, 108))


def scenario(arch, dtype, **options):
    reqs = [
        {"prompt_ids": LOOP * 4 + [5], "max_tokens": 10, "sampling": {"ignore_eos": True}},
        {
            "prompt_ids": list(range(300, 311)),
            "max_tokens": 7,
            "arrival_step": 1,
            "sampling": {"ignore_eos": True, "temperature": 0.8, "seed": 1},
        },
    ]
    return from_dict(
        {
            "model": {"arch": arch, "seed": 0},
            "target": {"engine": "tinyserve", "dtype": dtype, "options": {"block_size": 4, **options}},
            "workload": {"requests": reqs},
        }
    )


def draft():
    return str(ensure_checkpoint({"arch": "llama", "seed": 1, "num_hidden_layers": 1}))


CASES = {
    "int8-qwen2-bf16": ("qwen2", "bfloat16", {"quantization": "int8"}),
    "int4-mistral-fp32": (
        "mistral",
        "float32",
        {"quantization": "int4", "quant_group_size": 16, "prefix_caching": True},
    ),
    "ngram-llama-fp32": ("llama", "float32", {"speculative": "ngram", "num_speculative_tokens": 3}),
    "draft-llama-bf16": (
        "llama",
        "bfloat16",
        {
            "speculative": "draft",
            "num_speculative_tokens": 4,
            "draft": True,
            "chunked_prefill": True,
            "max_num_batched_tokens": 16,
        },
    ),
    "tp2-gemma2-bf16": ("gemma2", "bfloat16", {"tensor_parallel_size": 2, "prefix_caching": True}),
}


@pytest.mark.parametrize("name", CASES)
def test_probe_reports_no_divergence_on_part2_features(name):
    arch, dtype, options = CASES[name]
    if options.pop("draft", False):
        options["draft_model"] = draft()
    result = Prober().probe(scenario(arch, dtype, **options))
    assert result.divergent_taps == [] and not result.diverged, result.summary
    assert all(o.text is not None for o in result.target.outputs)


def test_capabilities_list_tensor_parallel_sizes():
    assert TinyServeEngine().capabilities().tp_sizes == (1, 2)


def trace(texts):
    return Trace("x", "float32", [RequestOutput([1, 2], [3, 4], text=t) for t in texts])


def test_text_mismatch_is_a_divergence_at_the_detokenizer_tap():
    sc = scenario("llama", "float32")
    target, reference = trace(["caf\ufffd", "ok"]), trace(["café", "ok"])
    assert text_divergence(sc, target, reference) == [0]
    result = compare_traces(sc, target, reference, reference)
    assert result.diverged and result.divergent_taps == [TEXT_TAP]
    assert result.first.tap == TEXT_TAP and result.first.requests == [0] and result.first.positions == [2, 3]
    assert result.to_dict()["text_divergence"] == [0]


def test_text_is_not_compared_when_a_stop_string_cut_it():
    sc = scenario("llama", "float32")
    stopped = sc.with_requests(
        [r if i else type(r)(prompt_ids=r.prompt_ids, sampling={"stop": ["x"]}) for i, r in enumerate(sc.requests)]
    )
    assert text_divergence(stopped, trace(["a", "b"]), trace(["ax", "b"])) == []
