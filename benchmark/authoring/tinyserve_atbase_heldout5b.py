"""The second half of a fifth held-out set of bugs at base on tinyserve (issues 2721-2726; DESIGN §6b "Bug at base").

    python -m benchmark.author ts-base-fused-proj-unquantized ...

Same shape as tinyserve_atbase_heldout4: each bug is folded into the `base` commit
(`commits/00-base-<slug>.patch`), so no commit introduces it and there is no good ref; the history after
base is the 10+ distractor commits that touch the faulty component's file
(benchmark/authoring/atbase_data/distractors.py). Five categories: quantization (2721, 2723), attention (2722),
model-config (2724), kernel (2725), sampling (2726); the mechanisms are new to the at-base track, three of the
functions too (the files are not). Each is modelled on an upstream silent bug; the issue texts
(benchmark/authoring/issues/<id>.md) say it has never worked for the reporter. Written without running the
diagnosis on them.
"""

from __future__ import annotations

from benchmark.authoring.atbase_data import distractors as d
from benchmark.authoring.tinyserve_atbase import AtBaseCase, greedy, prompt, scenario


def seeded(prompt_seed: int, n: int, max_tokens: int, **sampling) -> dict:
    """A sampled request on a random prompt; `sampling` holds the request's own seed."""
    return {"prompt_ids": prompt(prompt_seed, n), "max_tokens": max_tokens, "sampling": sampling | {"ignore_eos": True}}


CASES = [
    AtBaseCase(
        id="ts-base-fused-proj-unquantized",
        issue_number=2721,
        category="quantization",
        modeled_on=["vllm-project/vllm#51249", "vllm-project/vllm#43981", "sgl-project/sglang#26213"],
        title="int4 output has never matched a 4-bit reference, and it is suspiciously close to full precision",
        bug_message="quantization: weight-only int8 / int4 at load time",
        bug=[
            (
                d.QUANT,
                "    count = 0\n    for name, module in model.named_modules():\n"
                '        if isinstance(module, LinearBase) and ".layers." in f".{name}":\n',
                "    count = 0\n    for name, module in model.named_modules():\n"
                '        if isinstance(module, LinearBase) and name.rsplit(".", 1)[-1] in QUANTIZED_PROJECTIONS:\n',
            ),
            (
                d.QUANT,
                "MIN_SCALE = torch.finfo(torch.float32).tiny\n",
                "MIN_SCALE = torch.finfo(torch.float32).tiny\n"
                "# the decoder-layer projections that are quantized, named as in the checkpoint\n"
                'QUANTIZED_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")\n',
            ),
        ],
        files=[d.QUANT],
        repro=scenario(
            {"arch": "llama", "seed": 2721},
            [greedy(2721, 18, 8), greedy(2821, 11, 8)],
            options={"block_size": 16, "quantization": "int4", "quant_group_size": 32},
        ),
        truth_file=d.QUANT,
        truth_function="quantize_linears",
        component="quantization",
        mechanism="the layers to quantize are picked by checkpoint projection names (q_proj, gate_proj, ...) while "
        "the engine's modules are the fused qkv_proj and gate_up_proj: only o_proj and down_proj are quantized, "
        "the fused projections stay in full precision",
    ),
    AtBaseCase(
        id="ts-base-prefill-gqa-heads",
        issue_number=2722,
        category="attention",
        modeled_on=["onnx/onnx#7274", "apple/axlearn#842", "flashinfer-ai/flashinfer#1148"],
        title="Grouped-query models have never matched transformers from the first generated token on",
        bug_message="ops: paged attention kernels",
        bug=[
            (
                d.ATTN,
                "    qg = q.to(_acc(q.dtype)).view(L, kvh, H // kvh, D).permute(1, 2, 0, 3)   # [KVH, G, L, D]\n",
                "    qg = q.to(_acc(q.dtype)).view(L, H // kvh, kvh, D).permute(2, 1, 0, 3)   # [KVH, G, L, D]\n",
            )
        ],
        files=[d.ATTN],
        repro=scenario({"arch": "llama", "seed": 2722}, [greedy(2722, 21, 8), greedy(2822, 9, 8)]),
        truth_file=d.ATTN,
        truth_function="paged_attention_prefill",
        component="attention",
        mechanism="the prefill kernel groups query heads as [G, KVH] instead of [KVH, G]: query head h attends "
        "with key/value head h % KVH rather than h // G (and its output lands in another head's slot), so every "
        "prompt is attended wrongly under GQA while single-token decode steps are right",
    ),
    AtBaseCase(
        id="ts-base-int4-zero-truncated",
        issue_number=2723,
        category="quantization",
        modeled_on=["ModelCloud/GPTQModel#2350", "openvinotoolkit/nncf#2807", "hatchetProject/QuEST#18"],
        title="int4 weight-only quantization has always been much worse than the same 4-bit scheme elsewhere",
        bug_message="quantization: weight-only int8 / int4 at load time",
        bug=[
            (
                d.QUANT,
                "    zero = torch.clamp(torch.round(-lo / scale), 0, 15)\n",
                "    zero = torch.clamp(-lo / scale, 0, 15)          # the offset that maps lo to code 0\n",
            )
        ],
        files=[d.QUANT],
        repro=scenario(
            {"arch": "llama", "seed": 2723},
            [greedy(2723, 16, 8)],
            options={"block_size": 16, "quantization": "int4", "quant_group_size": 32},
        ),
        truth_file=d.QUANT,
        truth_function="quantize_group_int4",
        component="quantization",
        mechanism="the int4 zero point is left fractional: the codes q = round(w / s) + z are fractional too and "
        "both are truncated by the uint8 cast, so most weights dequantize up to one step off (a biased error, "
        "not rounding noise)",
    ),
    AtBaseCase(
        id="ts-base-query-scalar-head-dim",
        issue_number=2724,
        category="model-config",
        modeled_on=["ggml-org/llama.cpp#8444", "google/gemma_pytorch#71", "keras-team/keras-hub#1701"],
        title="A Gemma 2 checkpoint whose query_pre_attn_scalar is not its head_dim has never matched transformers",
        bug_message="config: engine and model configuration",
        bug=[
            (
                d.CONFIG,
                '            query_pre_attn_scalar=hf.get("query_pre_attn_scalar") if gemma else None,\n',
                "            # Gemma 2 scales queries by 1 / sqrt(head_dim) (its query_pre_attn_scalar)\n"
                '            query_pre_attn_scalar=(hf.get("head_dim") or hf["hidden_size"] // heads) if gemma else None,\n',
            )
        ],
        files=[d.CONFIG],
        repro=scenario(
            {"arch": "gemma2", "seed": 2724, "config_json": {"query_pre_attn_scalar": 32}},
            [greedy(2724, 14, 8)],
        ),
        truth_file=d.CONFIG,
        truth_function="ModelConfig.from_dict",
        component="config",
        mechanism="the config reader takes Gemma 2's query_pre_attn_scalar from head_dim instead of the config key, "
        "so checkpoints whose scalar differs from head_dim (Gemma 2 27B: hidden_size / heads) scale every "
        "attention score by the wrong factor",
    ),
    AtBaseCase(
        id="ts-base-decode-partition-blocks",
        issue_number=2725,
        category="kernel",
        modeled_on=["flashinfer-ai/flashinfer#1614", "ggml-org/llama.cpp#8311", "Dao-AILab/flash-attention#2550"],
        title="With block_size=48 generation has never matched block_size=16 once the context passes ~50 tokens",
        bug_message="ops: paged attention kernels",
        bug=[
            (
                d.ATTN,
                "    part = -(-DECODE_PARTITION_TOKENS // bs) * bs     # whole blocks per partition\n",
                "    part = DECODE_PARTITION_TOKENS                    # keys per split-KV partition\n",
            )
        ],
        files=[d.ATTN],
        repro=scenario({"arch": "llama", "seed": 2725}, [greedy(2725, 52, 12)], options={"block_size": 48}),
        truth_file=d.ATTN,
        truth_function="paged_attention_decode",
        component="attention",
        mechanism="the split-KV partition size is not rounded to whole blocks: when block_size does not divide "
        "64 a partition covers floor(64 / bs) blocks but is labelled as 64 positions, so keys past the first "
        "whole blocks are skipped or attributed to the wrong positions in every decode step",
    ),
    AtBaseCase(
        id="ts-base-top-p-mask-gathered",
        issue_number=2726,
        category="sampling",
        modeled_on=["lucidrains/PaLM-rlhf-pytorch#60", "neuralmagic/deepsparse#1291", "vllm-project/vllm#26859"],
        title="top_p has never behaved like transformers' nucleus sampling: unlikely tokens show up, likely ones vanish",
        bug_message="layers: batched sampler",
        bug=[
            (
                d.SAMPLER,
                "        remove = remove_sorted.scatter(1, order, remove_sorted)\n",
                "        remove = remove_sorted.gather(1, order)          # back to vocabulary order\n",
            )
        ],
        files=[d.SAMPLER],
        repro=scenario({"arch": "llama", "seed": 2726}, [seeded(2726, 15, 10, temperature=1.0, top_p=0.5, seed=3)]),
        truth_file=d.SAMPLER,
        truth_function="Sampler.apply_top_p",
        component="sampler",
        mechanism="the nucleus mask computed in sorted order is brought back to vocabulary order with gather(order) "
        "instead of scatter(order): the permutation is applied the wrong way round, so the tokens removed are "
        "not the low-probability tail but an unrelated set",
    ),
]
