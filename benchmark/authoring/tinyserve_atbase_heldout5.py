"""A third held-out set of bugs at base on tinyserve (issues 2701-2706; DESIGN §6b "Bug at base").

    python -m benchmark.author ts-base-top-p-gathered ...

Same shape as tinyserve_atbase_heldout4: each bug is folded into the `base` commit
(`commits/00-base-<slug>.patch`), so no commit introduces it and there is no good ref; the history after
base is the 10+ distractor commits that touch the faulty component's files
(benchmark/authoring/atbase_data/distractors.py). Six categories, one case each: sampling, kernel,
positional-encoding, kv-cache, model-config, quantization; six different files. Each is modelled on an
upstream silent bug; the issue texts (benchmark/authoring/issues/<id>.md) say it has never worked for
the reporter.
"""

from __future__ import annotations

from benchmark.authoring.atbase_data import distractors as d
from benchmark.authoring.tinyserve_atbase import AtBaseCase, greedy, prompt, scenario


def sampled(prompt_seed: int, n: int, max_tokens: int, **sampling) -> dict:
    """A seeded sampled request (`seed` among `sampling`) over a random prompt."""
    return {"prompt_ids": prompt(prompt_seed, n), "max_tokens": max_tokens, "sampling": sampling | {"ignore_eos": True}}


CASES = [
    AtBaseCase(
        id="ts-base-top-p-gathered",
        issue_number=2701,
        category="sampling",
        modeled_on=["lucidrains/PaLM-rlhf-pytorch#60", "ml-explore/mlx-lm#1825", "vllm-project/vllm#29746"],
        title="top_p sampling has never produced the distribution transformers' top-p warper gives",
        bug_message="layers: batched sampler",
        bug=[
            (
                d.SAMPLER,
                "        remove = remove_sorted.scatter(1, order, remove_sorted)\n",
                "        remove = remove_sorted.gather(1, order)       # back to vocabulary order\n",
            )
        ],
        files=[d.SAMPLER],
        repro=scenario({"arch": "llama", "seed": 2701}, [sampled(2701, 15, 10, temperature=1.0, top_p=0.8, seed=31)]),
        truth_file=d.SAMPLER,
        truth_function="Sampler.apply_top_p",
        component="sampler",
        mechanism="the top-p mask computed in sorted order is mapped back to vocabulary order with gather(order) "
        "instead of scatter(order): the inverse permutation, so the tokens removed are not the low-probability "
        "tail but an arbitrary set, and tokens of the nucleus are dropped",
    ),
    AtBaseCase(
        id="ts-base-rotate-in-place",
        issue_number=2702,
        category="kernel",
        modeled_on=["Tencent/ncnn#6833", "vllm-project/vllm-ascend#16978", "ROCm/ATOM#1094"],
        title="The default rotary kernel has never matched its native twin or transformers past position 0",
        bug_message="ops: rotary embedding kernels",
        bug=[
            (
                d.ROT_OP,
                "    out = torch.empty_like(x)\n",
                "    out = x                          # rotate in place: q and k are this step's own buffers\n",
            )
        ],
        files=[d.ROPE, d.ROT_OP],
        repro=scenario({"arch": "llama", "seed": 2702}, [greedy(2702, 12, 8)]),
        truth_file=d.ROT_OP,
        truth_function="_rotate",
        component="rotary",
        mechanism="the rotation writes into its input: the first half is overwritten with x1 cos - x2 sin before "
        "the second half is computed from it, so the second half gets x2 cos + (x1 cos - x2 sin) sin; only "
        "position 0 (sin = 0) comes out right",
    ),
    AtBaseCase(
        id="ts-base-llama3-low-band",
        issue_number=2703,
        category="positional-encoding",
        modeled_on=["Lightning-AI/litgpt#1745", "ml-explore/mlx-examples#907", "jmaczan/tiny-vllm#1"],
        title="Llama 3.1-style rope scaling has never matched transformers on our checkpoint",
        bug_message="layers: rotary embedding and its scaling variants",
        bug=[
            (
                d.ROPE,
                "    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)\n",
                "    scaled = torch.where(wavelen > old_len / high, inv_freq / factor, inv_freq)\n",
            )
        ],
        files=[d.ROPE],
        repro=scenario(
            {
                "arch": "llama",
                "seed": 2703,
                "rope_parameters": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                    "rope_theta": 500000.0,
                },
            },
            [greedy(2703, 30, 8)],
        ),
        truth_file=d.ROPE,
        truth_function="llama3_inv_freq",
        component="rotary_embedding",
        mechanism="the low-frequency cut compares wavelengths against old_len / high_freq_factor instead of "
        "old_len / low_freq_factor, so the medium band is divided by the factor before it is blended and the "
        "blend divides it again",
    ),
    AtBaseCase(
        id="ts-base-decode-partition-unaligned",
        issue_number=2704,
        category="kv-cache",
        modeled_on=["vllm-project/vllm#57711", "ROCm/rocMLIR#1895", "flashinfer-ai/flashinfer#3022"],
        title="block_size=24: decoding after a prompt of 50+ tokens has never matched transformers",
        bug_message="ops: paged attention kernels",
        bug=[
            (
                d.ATTN,
                "    part = -(-DECODE_PARTITION_TOKENS // bs) * bs     # whole blocks per partition\n",
                "    part = DECODE_PARTITION_TOKENS                      # keys per partition\n",
            )
        ],
        files=[d.ATTN],
        repro=scenario({"arch": "llama", "seed": 2704}, [greedy(2704, 60, 8)], {"block_size": 24}),
        truth_file=d.ATTN,
        truth_function="paged_attention_decode",
        component="attention",
        mechanism="the split-KV partition is 64 keys whatever the block size, so with a block size that does not "
        "divide 64 a partition's slice of the block table (p0 // bs to (p0 + 64) // bs) no longer starts at p0: "
        "cached keys are read under the wrong positions and the last ones of the context are masked away",
    ),
    AtBaseCase(
        id="ts-base-attn-cap-from-final",
        issue_number=2705,
        category="model-config",
        modeled_on=["ggml-org/llama.cpp#21390", "ggml-org/llama.cpp#8197", "vllm-project/vllm#5908"],
        title="Gemma 2 with large activations has never matched transformers (attention scores differ)",
        bug_message="config: engine and model configuration",
        bug=[
            (
                d.CONFIG,
                '            attn_logit_softcapping=hf.get("attn_logit_softcapping") if gemma else None,\n',
                '            attn_logit_softcapping=hf.get("final_logit_softcapping") if gemma else None,\n',
            )
        ],
        files=[d.CONFIG],
        repro=scenario({"arch": "gemma2", "seed": 2705, "initializer_range": 0.3}, [greedy(2705, 16, 8)]),
        truth_file=d.CONFIG,
        truth_function="ModelConfig.from_dict",
        component="config",
        mechanism="the attention soft-cap is read from final_logit_softcapping (30 in Gemma 2) instead of "
        "attn_logit_softcapping (50), so every attention score is capped at the final logits' value",
    ),
    AtBaseCase(
        id="ts-base-int8-bias-scaled",
        issue_number=2706,
        category="quantization",
        modeled_on=["huggingface/text-generation-inference#1036", "PaddlePaddle/Paddle#35186", "awslabs/slapo#10"],
        title="int8 weight-only quantization has never worked on Qwen2 checkpoints (llama is fine)",
        bug_message="ops: weight-only quantized matmul",
        bug=[
            (
                d.QMM,
                "    if zero is None:\n"
                "        out = F.linear(xa, qweight.to(xa.dtype)) * scale.to(xa.dtype)\n"
                "    else:\n"
                "        out = _int4_matmul(xa, qweight, scale, zero, group_size)\n",
                "    if zero is None:\n"
                "        # the bias rides along with the integer product\n"
                "        out = F.linear(xa, qweight.to(xa.dtype), None if bias is None else bias.to(xa.dtype))\n"
                "        return (out * scale.to(xa.dtype)).to(x.dtype)\n"
                "    out = _int4_matmul(xa, qweight, scale, zero, group_size)\n",
            )
        ],
        files=[d.QMM],
        repro=scenario(
            {"arch": "qwen2", "seed": 2706, "perturb_init": True},
            [greedy(2706, 14, 8)],
            {"block_size": 16, "quantization": "int8"},
        ),
        truth_file=d.QMM,
        truth_function="dequant_matmul",
        component="quant_matmul",
        mechanism="the int8 path adds the bias to the integer product and then multiplies by the per-channel "
        "scale, so every bias (qwen2's q/k/v biases) is shrunk by its channel's scale, i.e. almost dropped",
    ),
]
