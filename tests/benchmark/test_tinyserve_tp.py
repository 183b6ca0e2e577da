"""tinyserve tensor parallelism (2 gloo processes on CPU): tokens, logprobs and gathered taps equal TP=1."""

import pytest
import torch
from tinyserve import LLMEngine, SamplingParams
from tinyserve.config import ModelConfig
from tinyserve.distributed.loader import shard_config, shard_tensor

from benchmark.subjects import check_tinyserve  # noqa: F401  (puts the subject on sys.path)
from tools.engines.protocol import RunJob
from tools.engines.runner import DIFFDX_ROOT, run_engine
from tools.probe.checkpoints import ensure_checkpoint
from tools.scenario import from_dict

torch.set_num_threads(1)
SOURCE_ROOT = DIFFDX_ROOT / "benchmark" / "subjects" / "tinyserve"


def test_fused_qkv_shards_follow_heads_with_gqa():
    """Rank r holds query heads r*H/tp.. and KV heads r*KVH/tp..: with H=4, KVH=2, D=2 at tp=2,
    rank 1 gets q rows 4..7 and k rows 2..3, never a slice of the fused tensor."""
    q, k = torch.arange(8.0).view(8, 1), torch.arange(4.0).view(4, 1)
    assert shard_tensor("model.layers.0.self_attn.q_proj.weight", q, 1, 2).flatten().tolist() == [4, 5, 6, 7]
    assert shard_tensor("model.layers.0.self_attn.k_proj.weight", k, 1, 2).flatten().tolist() == [2, 3]
    o = torch.arange(8.0).view(1, 8)
    assert shard_tensor("model.layers.0.self_attn.o_proj.weight", o, 1, 2).flatten().tolist() == [4, 5, 6, 7]
    assert shard_tensor("model.layers.0.self_attn.o_proj.bias", torch.ones(3), 1, 2).tolist() == [0, 0, 0]
    cfg = shard_config(ModelConfig.from_dir(ensure_checkpoint({"arch": "llama", "seed": 0})), 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (2, 1, 64)


def generate(arch, dtype, tp, prompts):
    engine = LLMEngine.from_options(
        str(ensure_checkpoint({"arch": arch, "seed": 0})),
        dtype=dtype,
        tensor_parallel_size=tp,
        block_size=4,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        max_num_batched_tokens=32,
    )
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] = o
    if tp > 1:
        engine.model_runner.shutdown()
    return [outs[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma2"])
def test_tp2_tokens_and_logprobs_equal_tp1(arch):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (41, 9, 70)]
    one, two = generate(arch, "float32", 1, prompts), generate(arch, "float32", 2, prompts)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]
    assert max(abs(a - b) for x, y in zip(one, two) for a, b in zip(x.logprobs, y.logprobs)) < 1e-4


def test_tp2_gathered_taps_equal_tp1_taps():
    def scenario(tp):
        return from_dict(
            {
                "model": {"arch": "qwen2", "seed": 0},
                "target": {
                    "engine": "tinyserve",
                    "dtype": "float32",
                    "options": {"tensor_parallel_size": tp, "block_size": 4},
                },
                "workload": {
                    "requests": [
                        {"prompt_ids": list(range(40, 63)), "max_tokens": 4},
                        {"prompt_ids": [5, 6, 7], "max_tokens": 3, "arrival_step": 1},
                    ]
                },
            }
        )

    traces = []
    for tp in (1, 2):
        sc = scenario(tp)
        traces.append(run_engine(RunJob(sc, sc.target, str(ensure_checkpoint(sc.model))), SOURCE_ROOT))
    one, two = traces
    assert two.meta["tp"]["size"] == 2 and [o.output_ids for o in two.outputs] == [o.output_ids for o in one.outputs]
    assert [(r.name, r.step, r.request, r.positions) for r in two.records] == [
        (r.name, r.step, r.request, r.positions) for r in one.records
    ]
    for a, b in zip(one.records, two.records):
        assert a.tensor.shape == b.tensor.shape, a.name
        torch.testing.assert_close(b.tensor, a.tensor, rtol=1e-4, atol=1e-5, msg=a.name)
