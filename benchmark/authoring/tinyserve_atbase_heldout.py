"""Held-out bugs at base on tinyserve (issues 2301-2304; DESIGN §6b "Bug at base").

    python -m benchmark.author ts-base-rmsnorm-row-count ...

Same shape as tinyserve_atbase: each bug is folded into the `base` commit (`commits/00-base-<slug>.patch`),
so no commit introduces it and there is no good ref; the history after base is the 10+ distractor commits
that touch the faulty component's files (benchmark/authoring/atbase_data/distractors.py). Each is modelled on
an upstream silent bug; the issue texts (benchmark/authoring/issues/<id>.md) say it has never worked.
"""

from __future__ import annotations

from benchmark.authoring.atbase_data import distractors as d
from benchmark.authoring.tinyserve_atbase import AtBaseCase, greedy, scenario

CASES = [
    AtBaseCase(
        id="ts-base-rmsnorm-row-count",
        issue_number=2301,
        category="numerics",
        modeled_on=["tenstorrent/tt-mlir#8798", "bkitano/llama-from-scratch#4", "kyegomez/zeta#180"],
        title="Hidden states never match transformers and the mismatch changes with the prompt length",
        bug_message="ops: RMSNorm kernels",
        bug=[
            (
                d.NORM,
                "    inv_rms = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)\n",
                "    inv_rms = torch.rsqrt(xf.square().sum(-1, keepdim=True) / x.shape[0] + eps)\n",
            )
        ],
        files=[d.NORM],
        repro=scenario({"arch": "llama", "seed": 231}, [greedy(2301, 14)]),
        truth_file=d.NORM,
        truth_function="rms_norm",
        component="norm",
        mechanism="the optimized RMSNorm divides the row's sum of squares by the number of rows (tokens) instead of "
        "the hidden size, so every norm output is scaled by sqrt(T / H): wrong for any batch that is not exactly "
        "hidden_size tokens long, and by a different factor at every step",
    ),
    AtBaseCase(
        id="ts-base-norm-eps-key",
        issue_number=2302,
        category="model-config",
        modeled_on=["huggingface/transformers#38025", "PaddlePaddle/FastDeploy#2804", "OpenNMT/OpenNMT-py#2446"],
        title="A checkpoint with rms_norm_eps = 1e-5 and small weights has never matched transformers",
        bug_message="config: ModelConfig from config.json",
        bug=[
            (
                d.CONFIG,
                '            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),\n',
                '            rms_norm_eps=hf.get("layer_norm_eps", 1e-6),\n',
            )
        ],
        files=[d.CONFIG],
        repro=scenario(
            {"arch": "llama", "seed": 232, "rms_norm_eps": 1e-5, "initializer_range": 0.002}, [greedy(2302, 12)]
        ),
        truth_file=d.CONFIG,
        truth_function="ModelConfig.from_dict",
        component="config",
        mechanism="the RMSNorm epsilon is read from layer_norm_eps, a key llama-family configs never carry, so "
        "every model runs with the 1e-6 fallback whatever rms_norm_eps says; rows with a small mean square are "
        "normalised by a visibly different factor",
    ),
    AtBaseCase(
        id="ts-base-int4-scale-sixteen",
        issue_number=2303,
        category="quantization",
        modeled_on=[
            "IntelLabs/distiller#463",
            "microsoft/onnxruntime#29509",
            "mrusci/training-mixed-precision-quantized-networks#1",
        ],
        title="int4 output has never matched the dequantized-checkpoint reference, even in float32",
        bug_message="quantization: weight-only int8 / int4 at load time",
        bug=[
            (
                d.QUANT,
                "    scale = torch.clamp_min((hi - lo) / 15.0, MIN_SCALE)\n",
                "    scale = torch.clamp_min((hi - lo) / 16.0, MIN_SCALE)\n",
            )
        ],
        files=[d.QUANT],
        repro=scenario(
            {"arch": "llama", "seed": 233},
            [greedy(2303, 16)],
            {"block_size": 16, "quantization": "int4", "quant_group_size": 32},
        ),
        truth_file=d.QUANT,
        truth_function="quantize_group_int4",
        component="quantization",
        mechanism="the int4 scale spreads each group's range over 16 steps where the 4-bit codes only hold 0..15, so "
        "every group is quantized on a finer grid than the scheme defines and its largest weights are clipped by "
        "one step",
    ),
    AtBaseCase(
        id="ts-base-rope-half-exponents",
        issue_number=2304,
        category="positional-encoding",
        modeled_on=["rasbt/LLMs-from-scratch#410", "microsoft/torchscale#80", "hustvl/ControlAR#18"],
        title="Every llama-family model drifts from transformers after the first few positions, all rope types",
        bug_message="layers: rotary embedding and its scaling variants",
        bug=[
            (
                d.ROPE,
                "    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))\n",
                "    return 1.0 / (base ** (torch.arange(0, dim // 2, dtype=torch.int64).to(dtype=torch.float) / dim))\n",
            )
        ],
        files=[d.ROPE],
        repro=scenario({"arch": "qwen2", "seed": 234}, [greedy(2304, 24)]),
        truth_file=d.ROPE,
        truth_function="_base_inv_freq",
        component="rotary_embedding",
        mechanism="the rotary exponents step by 1/dim instead of 2/dim (arange(dim // 2) / dim), so every pair but "
        "the first turns faster than theta^(-2i/dim) and the slowest pair only reaches theta^(-1/2)",
    ),
]
